#include "xla_spawn/launcher/options.h"

#include <sched.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <boost/program_options.hpp>

#include "xla_spawn/base/env.h"
#include "xla_spawn/launcher/ordinal_set.h"
#include "xla_spawn/replica/context.h"

namespace po = boost::program_options;

namespace xs {
namespace {

constexpr double kMaxSeconds = 365.0 * 24 * 3600;  // a year: anything above is a typo
constexpr int64_t kMaxRestarts = 1000;

po::options_description describe_options() {
  po::options_description desc("Options");
  // One option per paragraph reads better than the formatter's layout.
  // clang-format off
  desc.add_options()
      ("help,h", "show this help and exit")
      ("version", "print the version and exit")
      ("nprocs,n", po::value<std::string>()->value_name("N"),
       "number of replicas on this node, 1..1024 (default: the CPUs it may use; -np also "
       "works)")
      ("no-prefix", po::bool_switch(), "do not prefix console lines with \"[ordinal] \"")
      ("timestamp", po::bool_switch(), "prefix each line with the local time HH:MM:SS.mmm")
      ("log-dir", po::value<std::string>()->value_name("DIR"),
       "also write each ordinal's output to DIR/ordinal-<k>.log (all ordinals, all lines)")
      ("show-ordinals", po::value<std::string>()->value_name("LIST"),
       "show only these ordinals on the console, e.g. 0,2-3 (log files keep everything)")
      ("grace-period", po::value<std::string>()->value_name("SECONDS"),
       "after SIGTERM, wait this long before SIGKILL (default 3)")
      ("timeout", po::value<std::string>()->value_name("SECONDS"),
       "stop the whole job after this long and exit 124 (default: no limit)")
      ("bind-cores", po::bool_switch(),
       "pin ordinal k to the (k mod CPUs)-th allowed CPU (default: when 2 <= N <= CPUs)")
      ("no-bind-cores", po::bool_switch(), "never pin replicas to CPUs")
      ("trace", po::value<std::string>()->value_name("FILE"),
       "record a timeline of every replica (steps, compiles, collectives, data waits) and "
       "write it to FILE as Chrome trace-event JSON (Perfetto, chrome://tracing)")
      ("max-restarts", po::value<std::string>()->value_name("K"),
       "after a failure, restart the whole group up to K times (default 0)")
      ("nnodes", po::value<std::string>()->value_name("N"),
       "number of nodes (hosts) of the job, one xla-spawn on each (default 1, or from "
       "Slurm's or Open MPI's environment)")
      ("node-rank", po::value<std::string>()->value_name("K"), "this node's index, 0..N-1")
      ("master-addr", po::value<std::string>()->value_name("ADDR"),
       "address of node 0, which runs the job's rendezvous on it (default with Slurm: the "
       "first host of the allocation)")
      ("master-port", po::value<std::string>()->value_name("PORT"),
       "port of the rendezvous on node 0 (default 29500)")
      ("rdzv-timeout", po::value<std::string>()->value_name("SECONDS"),
       "how long the nodes wait for each other (default 300)");
  // clang-format on
  return desc;
}

// Options that take a value, so the scan for the command can skip their values.
bool takes_value(const std::string& name) {
  static const std::set<std::string> kValued = {
      "n",         "nprocs",       "log-dir",   "show-ordinals", "grace-period",
      "timeout",   "max-restarts", "nnodes",    "node-rank",     "master-addr",
      "master-port", "rdzv-timeout", "trace"};
  return kValued.count(name) > 0;
}

bool looks_negative_number(const std::string& token) {
  return token.size() > 1 && token[0] == '-' &&
         (std::isdigit(static_cast<unsigned char>(token[1])) || token[1] == '.');
}

struct SplitArgs {
  std::vector<std::string> options;
  std::vector<std::string> command;
};

// Separates xla-spawn's options from the command. Rewrites mpirun's "-np" to "--nprocs" and
// "-n -1" to "--nprocs=-1", so a negative count gets a range message, not "unknown option".
SplitArgs split_args(int argc, const char* const* argv) {
  SplitArgs split;
  int i = 1;
  for (; i < argc; ++i) {
    std::string token = argv[i];
    if (token == "--") {
      ++i;
      break;
    }
    if (token.size() < 2 || token[0] != '-') break;  // the command starts here
    if (token == "-np") token = "--nprocs";
    const bool is_long = token.rfind("--", 0) == 0;
    const std::string name = is_long ? token.substr(2, token.find('=') - 2) : token.substr(1);
    const bool value_attached = is_long ? token.find('=') != std::string::npos : token.size() > 2;
    if (!value_attached && takes_value(name) && i + 1 < argc) {
      const std::string value = argv[++i];
      const std::string long_name = name == "n" ? "nprocs" : name;
      if (looks_negative_number(value)) {
        split.options.push_back(fmt::format("--{}={}", long_name, value));
      } else {
        split.options.push_back(token);
        split.options.push_back(value);
      }
      continue;
    }
    split.options.push_back(token);
  }
  // Boost.Program_options 1.74 loops forever formatting an error about a token that holds one
  // of its %placeholders% (found by fuzz/spawn_options): '%' only in a known option's value.
  for (const std::string& t : split.options) {
    const bool valued = t.rfind("--", 0) == 0 && takes_value(t.substr(2, t.find('=') - 2));
    if (t[0] == '-' && t.find('%') < (valued ? t.find('=') : std::string::npos))
      throw UsageError(fmt::format("{}: '%' is only allowed in an option's value", t), true);
  }
  for (; i < argc; ++i) split.command.emplace_back(argv[i]);
  return split;
}

std::chrono::milliseconds parse_seconds(const std::string& text, const char* flag) {
  double seconds = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, seconds);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(seconds) || seconds < 0 ||
      seconds > kMaxSeconds) {
    throw UsageError(
        fmt::format("{}='{}': expected seconds, a number in [0, {}]", flag, text, kMaxSeconds));
  }
  const int64_t ms = std::llround(seconds * 1000);
  if (seconds > 0 && ms == 0) {  // would mean "none" (--timeout) or "at once" (--grace-period)
    throw UsageError(fmt::format("{}='{}': less than a millisecond, the resolution", flag, text));
  }
  return std::chrono::milliseconds(ms);
}

// Wraps parse_int so its InvalidArgument becomes a UsageError (exit 2 with usage).
int64_t parse_flag_int(const std::string& text, int64_t min, int64_t max, const char* flag) {
  try {
    return parse_int(text, min, max, flag);
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
}

void apply_values(const po::variables_map& vm, CommandLine& cl) {
  cl.nprocs = vm.count("nprocs") ? static_cast<int>(parse_flag_int(vm["nprocs"].as<std::string>(),
                                                                   1, kMaxLocalWorldSize, "--nprocs"))
                                 : default_nprocs();
  SupervisorOptions& s = cl.supervisor;
  s.output.prefix = !vm["no-prefix"].as<bool>();
  s.output.timestamp = vm["timestamp"].as<bool>();
  if (vm["bind-cores"].as<bool>() && vm["no-bind-cores"].as<bool>()) {
    throw UsageError("--bind-cores and --no-bind-cores contradict each other");
  }
  s.bind_cores = vm["bind-cores"].as<bool>()      ? CoreBinding::kOn
                 : vm["no-bind-cores"].as<bool>() ? CoreBinding::kOff
                                                  : CoreBinding::kAuto;
  if (vm.count("log-dir")) s.output.log_dir = vm["log-dir"].as<std::string>();
  if (vm.count("log-dir") && s.output.log_dir.empty()) throw UsageError("--log-dir: empty path");
  if (vm.count("trace")) s.trace_file = vm["trace"].as<std::string>();
  if (s.trace_file && s.trace_file->empty()) throw UsageError("--trace: empty path");
  const auto flag = [&vm](const char* name) -> std::optional<std::string> {
    return vm.count(name) ? std::optional(vm[name].as<std::string>()) : std::nullopt;
  };
  cl.nodes = resolve_node_options({flag("nnodes"), flag("node-rank"), flag("master-addr"),
                                   flag("master-port"), flag("rdzv-timeout")});
  if (vm.count("show-ordinals")) {
    cl.show_ordinals = vm["show-ordinals"].as<std::string>();
    // One node: checked now; several: once the world size is known (resolve_shown_ordinals).
    if (!cl.nodes.multi_node()) s.output.shown = resolve_shown_ordinals(cl.show_ordinals, 0, cl.nprocs, cl.nprocs);
  }
  if (vm.count("grace-period")) {
    s.grace = parse_seconds(vm["grace-period"].as<std::string>(), "--grace-period");
  }
  if (vm.count("timeout")) s.timeout = parse_seconds(vm["timeout"].as<std::string>(), "--timeout");
  if (vm.count("max-restarts")) {
    s.max_restarts = static_cast<int>(
        parse_flag_int(vm["max-restarts"].as<std::string>(), 0, kMaxRestarts, "--max-restarts"));
  }
}

}  // namespace

std::vector<bool> resolve_shown_ordinals(const std::string& spec, int first_ordinal, int nprocs,
                                         int world_size) {
  std::vector<bool> all;
  try {
    all = parse_ordinal_set(spec, world_size);
  } catch (const InvalidArgument& e) {
    throw UsageError(fmt::format("{} (world size {})", e.what(), world_size));
  }
  return std::vector<bool>(all.begin() + first_ordinal, all.begin() + first_ordinal + nprocs);
}

int default_nprocs() {
  // The CPUs this process may use (taskset, a container's cpuset), as nproc counts them; all
  // online CPUs only when the set does not fit cpu_set_t (more than 1024).
  cpu_set_t set;
  CPU_ZERO(&set);
  const long cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                  : ::sysconf(_SC_NPROCESSORS_ONLN);
  return static_cast<int>(std::clamp<long>(cpus, 1, kMaxLocalWorldSize));
}

CommandLine parse_command_line(int argc, const char* const* argv) {
  const SplitArgs split = split_args(argc, argv);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(split.options).options(describe_options()).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what(), /*show_usage=*/true);
  }
  CommandLine cl;
  if (vm.count("help")) {
    cl.help = true;
    return cl;
  }
  if (vm.count("version")) {
    cl.version = true;
    return cl;
  }
  apply_values(vm, cl);
  if (split.command.empty()) {
    throw UsageError("no command given (xla-spawn [options] -- COMMAND)", /*show_usage=*/true);
  }
  cl.command = split.command;
  return cl;
}

std::string usage_text() {
  std::ostringstream text;
  text << "usage: xla-spawn [options] -- COMMAND [ARGS...]\n"
          "Runs N replicas of COMMAND, each with XLA_SPAWN_ORDINAL/RANK etc. in its\n"
          "environment, prefixes their output with the ordinal, and stops them all when one\n"
          "fails. Exit status: the first failure's code (128+signal if killed), 124 on\n"
          "--timeout, 128+S when stopped by signal S, 2 usage, 127 command not found.\n\n"
       << describe_options();
  return text.str();
}

std::vector<OptionDoc> option_docs() {
  std::vector<OptionDoc> docs;
  const po::options_description desc = describe_options();
  for (const auto& option : desc.options()) {
    OptionDoc doc;
    doc.long_name = option->long_name();
    doc.description = option->description();
    const std::string shown =
        option->canonical_display_name(po::command_line_style::allow_dash_for_short);
    if (shown.size() == 2 && shown[0] == '-') doc.short_name = shown[1];
    if (option->semantic()->max_tokens() > 0) doc.value_name = option->semantic()->name();
    docs.push_back(std::move(doc));
  }
  return docs;
}

std::string version_text() {
  return fmt::format("xla-spawn {}\n", XS_VERSION);
}

}  // namespace xs
