#pragma once
// xla-spawn's command line: `xla-spawn [options] -- COMMAND [ARGS...]`, parsed with
// Boost.Program_options and validated before anything is forked. Flag names follow
// torchrun/mpirun (--nprocs/-n, also mpirun's -np). Without "--", the first argument that
// is not an option or an option's value starts the command.
//
//   xs::CommandLine cl = xs::parse_command_line(argc, argv);   // throws xs::UsageError
//   if (cl.help) std::cout << xs::usage_text();

#include <string>
#include <vector>

#include "xla_spawn/base/error.h"
#include "xla_spawn/launcher/node_options.h"
#include "xla_spawn/launcher/supervisor.h"

namespace xs {

// The command line is malformed: xla-spawn prints the message (and, for a malformed
// command line rather than a bad value, the usage) and exits 2.
class UsageError : public InvalidArgument {
 public:
  explicit UsageError(const std::string& message, bool show_usage = false)
      : InvalidArgument(message), show_usage_(show_usage) {}
  bool show_usage() const { return show_usage_; }

 private:
  bool show_usage_;
};

struct CommandLine {
  int nprocs = 1;  // on this node
  NodeOptions nodes;
  // --show-ordinals as given: in a multi-node job it is resolved once the world is known.
  std::string show_ordinals;
  SupervisorOptions supervisor;
  std::vector<std::string> command;  // COMMAND [ARGS...]; non-empty unless help or version
  bool help = false;
  bool version = false;
};

// "xla-spawn X.Y.Z", the project's version (CMakeLists.txt).
std::string version_text();

// Parses and validates; argv[0] is the program name. Throws UsageError naming the flag, the
// value and what was expected.
CommandLine parse_command_line(int argc, const char* const* argv);

// --show-ordinals LIST over a job of `world_size`, cut to this node's replicas (ordinals
// first_ordinal .. first_ordinal + nprocs - 1). Throws UsageError.
std::vector<bool> resolve_shown_ordinals(const std::string& spec, int first_ordinal, int nprocs,
                                         int world_size);

// The --help text.
std::string usage_text();

// One option of the command line, from the table --help prints: the man page's OPTIONS and
// the bash completion are generated from these (launcher/docs_main.cpp), so none can drift.
struct OptionDoc {
  std::string long_name;    // "nprocs"
  char short_name = 0;      // 'n', or 0
  std::string value_name;   // "N", or empty for a switch
  std::string description;  // as --help shows it
};
std::vector<OptionDoc> option_docs();

// The default for --nprocs: the number of online CPUs.
int default_nprocs();

}  // namespace xs
