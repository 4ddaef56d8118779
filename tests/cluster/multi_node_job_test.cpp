// Multi-node jobs between simulated hosts (tests/support/namespace_cluster.h: each host its own
// network, mount and UTS namespace, address 198.18.0.x, /dev/shm and hostname): one real
// xla-spawn per host, gloo's TCP between hosts, real signals and a real link cut. The
// acceptance lines of the multi-node issue, as tests/launcher/multi_node_test.cpp checks them
// on loopback: every collective is right and bit-identical on every ordinal of a 2- and a
// 3-host job; a replica or a launcher killed, a host cut off or a launcher frozen stops every
// node within a bound, node 0's summary names node 1 and the cause, and nothing is left on any
// host; a restart across hosts ends with a clean run's parameters; 32 hosts form a job and
// finish. Every test skips, saying why, where clusters cannot be built (not root).

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "tests/support/deadline_scale.h"
#include "tests/support/namespace_cluster.h"

namespace xs::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kXlaSpawn = XS_XLA_SPAWN_PATH;
const std::string kTrainFmnist = XS_TRAIN_FMNIST_PATH;
const std::string kCollectivesCheck = XS_COLLECTIVES_CHECK_PATH;
// Every host has its own ports: torchrun's default will do on each.
const std::string kMasterPort = "29500";
// The replicas' collective deadline. A link cut or a frozen launcher must stop the job
// before it: found by the heartbeat timeout (5 s, the default), not by a collective timing out.
const std::chrono::milliseconds kCollectiveTimeout = scaled(15s);
// Generous for a loaded 2-core machine: the jobs themselves take seconds.
const std::chrono::milliseconds kJobDeadline = scaled(120s);
const std::chrono::milliseconds kCleanupDeadline = scaled(10s);

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// "a b c" -> {"a", "b", "c"}: flags written as they would be typed (no quoting).
std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> result;
  std::istringstream in(text);
  for (std::string word; in >> word;) result.push_back(word);
  return result;
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {}", WTERMSIG(status));
  return fmt::format("ended with wait status {:#x}", status);
}

// A launcher's end: its wait status and when the test saw it (within 5 ms, poll_until's step).
struct Exit {
  int status = 0;
  Clock::time_point at;
};

// Waits for every launcher in `pids` (children of this process) until `timeout`; an entry
// stays empty for one still running.
std::vector<std::optional<Exit>> wait_all(const std::vector<pid_t>& pids,
                                          std::chrono::milliseconds timeout) {
  std::vector<std::optional<Exit>> exits(pids.size());
  poll_until(
      [&] {
        bool all = true;
        for (size_t i = 0; i < pids.size(); ++i) {
          if (exits[i]) continue;
          if (const std::optional<int> status = wait_exit(pids[i], 0ms)) {
            exits[i] = Exit{*status, Clock::now()};
          } else {
            all = false;
          }
        }
        return all;
      },
      timeout);
  return exits;
}

// "4242 (train_fmnist --model ...); ..." from /proc/<pid>/cmdline, for messages about
// processes left behind.
std::string command_lines(const std::vector<pid_t>& pids) {
  std::string text;
  for (const pid_t pid : pids) {
    std::string command = read_file(fmt::format("/proc/{}/cmdline", pid));
    std::replace(command.begin(), command.end(), '\0', ' ');
    text +=
        fmt::format("{}{} ({})", text.empty() ? "" : "; ", pid, command.empty() ? "gone" : command);
  }
  return text;
}

// The value of `name` in the environment of process `pid`, or "".
std::string environment_value(pid_t pid, const std::string& name) {
  std::istringstream in(read_file(fmt::format("/proc/{}/environ", pid)));
  for (std::string entry; std::getline(in, entry, '\0');) {
    if (entry.starts_with(name + "=")) return entry.substr(name.size() + 1);
  }
  return "";
}

// The launcher's own lines (the summary among them, with the root cause's last lines, which
// it indents), without its replicas' output ("[k] ...").
std::string launcher_lines(const std::string& console) {
  std::string text;
  for (const std::string& line : lines_of(console)) {
    if (line.starts_with("xla-spawn") || line.starts_with("  [")) text += line + "\n";
  }
  return text;
}

// The summary's first line, "xla-spawn: job <id> attempt <k> failed after <t> s: <root cause>".
std::string root_cause_line(const std::string& console) {
  for (const std::string& line : lines_of(console)) {
    if (line.starts_with("xla-spawn: job ") && line.find(" failed after ") != std::string::npos) {
      return line;
    }
  }
  return "";
}

// (name, fingerprint) of each "FP <name> <fingerprint>" line of an ordinal's log, in order.
using Fingerprints = std::vector<std::pair<std::string, std::string>>;

Fingerprints fingerprints(const std::string& log) {
  Fingerprints result;
  for (const std::string& line : lines_of(log)) {
    std::istringstream in(line);
    std::string tag, name, value;
    if (in >> tag >> name >> value && tag == "FP") result.emplace_back(name, value);
  }
  return result;
}

// "" when `got` has the lines of `want`, else how many differ and the first that does.
std::string differences(const Fingerprints& got, const Fingerprints& want) {
  if (got == want) return "";
  std::string text = fmt::format("{} lines, expected {}", got.size(), want.size());
  size_t differing = 0;
  for (size_t i = 0; i < std::max(got.size(), want.size()); ++i) {
    const auto line = [](const Fingerprints& f, size_t i) {
      return i < f.size() ? fmt::format("FP {} {}", f[i].first, f[i].second) : "(none)";
    };
    if (line(got, i) == line(want, i)) continue;
    if (differing++ == 0) {
      text += fmt::format("; first difference at line {}: {}, expected {}", i, line(got, i),
                          line(want, i));
    }
  }
  return text + fmt::format("; {} line(s) differ", differing);
}

// A job's hosts each run one xla-spawn; host k runs sizes[k] replicas.
class MultiNodeJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const auto why = namespace_cluster_unavailable()) GTEST_SKIP() << *why;
    std::string pattern = (std::filesystem::temp_directory_path() / "xs-mnjob-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << errno_message("mkdtemp " + pattern, errno);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;  // a test that skipped has no directory
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  // Starts job `job`: host k's xla-spawn with sizes[k] replicas of `command`, its console in
  // console(job, k) and its replicas' lines in ordinal_log(job, o), with `env` over the
  // suite's environment. Returns the launchers' pids.
  std::vector<pid_t> start_job(NamespaceCluster& cluster, const std::string& job,
                               const std::vector<int>& sizes,
                               const std::vector<std::string>& command,
                               const std::vector<std::string>& flags = {},
                               const EnvVars& env = {}) {
    const auto rdzv_seconds = std::chrono::duration_cast<std::chrono::seconds>(scaled(60s));
    std::filesystem::create_directories(fmt::format("{}/{}", dir_, job));
    const std::string master = cluster.addr(0);  // asked once: the launches follow each other
    std::vector<pid_t> pids;
    for (int host = 0; host < static_cast<int>(sizes.size()); ++host) {
      std::vector<std::string> argv = concat(
          {kXlaSpawn, "--master-addr", master, "--log-dir",
           fmt::format("{}/{}/host-{}", dir_, job, host)},
          // --no-bind-cores: pinned, local ordinal k of every simulated host (the ends of one
          // network ring) would share CPU k of this machine.
          words(fmt::format("--nnodes {} --node-rank {} --master-port {} --rdzv-timeout {} -n {} "
                            "--no-bind-cores",
                            sizes.size(), host, kMasterPort, rdzv_seconds.count(),
                            sizes[static_cast<size_t>(host)])));
      argv.insert(argv.end(), flags.begin(), flags.end());
      argv.push_back("--");
      argv.insert(argv.end(), command.begin(), command.end());
      pids.push_back(cluster.spawn(host, argv, console(job, host), job_env(env)));
    }
    return pids;
  }

  std::string console(const std::string& job, int host) const {
    return fmt::format("{}/{}/console-{}.log", dir_, job, host);
  }
  // Ordinal `ordinal`'s log; `host` is the node that runs it.
  std::string ordinal_log(const std::string& job, int host, int ordinal) const {
    return fmt::format("{}/{}/host-{}/ordinal-{}.log", dir_, job, host, ordinal);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Every console of the job, for failure messages.
  std::string consoles(const std::string& job, int hosts) const {
    std::string text;
    for (int k = 0; k < hosts; ++k) {
      text += fmt::format("--- host {} ---\n{}", k, read_file(console(job, k)));
    }
    return text;
  }

  // Every launcher exited with code 0.
  void expect_all_succeeded(const std::vector<std::optional<Exit>>& exits, const std::string& job) {
    for (size_t k = 0; k < exits.size(); ++k) {
      ASSERT_TRUE(exits[k].has_value())
          << "host " << k << "'s xla-spawn still runs after " << kJobDeadline.count() << " ms:\n"
          << launcher_lines(read_file(console(job, static_cast<int>(k))));
      EXPECT_TRUE(WIFEXITED(exits[k]->status) && WEXITSTATUS(exits[k]->status) == 0)
          << "host " << k << "'s xla-spawn " << describe_status(exits[k]->status) << ":\n"
          << read_file(console(job, static_cast<int>(k)));
    }
  }

 private:
  static EnvVars job_env(const EnvVars& over) {
    EnvVars env = {{"XLA_SPAWN_JOB_TOKEN", "multi-node-job-test-token-0123"},
                   // The simulated hosts share 2 cores: spinning replicas would starve each other.
                   {"XLA_SPAWN_SPIN_US", "0"},
                   {"XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", std::to_string(kCollectiveTimeout.count())}};
    for (const auto& [name, value] : over) {
      std::erase_if(env, [&](const auto& kv) { return kv.first == name; });
      env.emplace_back(name, value);
    }
    return env;
  }

  std::string dir_;
};

// Nothing of any job is left on any host: no process in its network namespace, no entry in
// its /dev/shm (a launcher's reaper may still be removing its segment: polled, like pids).
void expect_nothing_left(const NamespaceCluster& cluster) {
  for (int host = 0; host < cluster.hosts(); ++host) {
    std::vector<pid_t> pids;
    EXPECT_TRUE(poll_until([&] { return (pids = cluster.pids(host)).empty(); }, kCleanupDeadline))
        << "host " << host << " still runs " << pids.size() << " process(es) after "
        << kCleanupDeadline.count() << " ms: " << command_lines(pids);
    std::vector<std::string> shm;
    EXPECT_TRUE(
        poll_until([&] { return (shm = cluster.shm_entries(host)).empty(); }, kCleanupDeadline))
        << "host " << host << "'s /dev/shm still holds " << fmt::format("{}", fmt::join(shm, ", "));
  }
}

// ---------------------------------------------------------------------------------------------
// Collectives: collectives_check on every replica of a job.

std::string topology_name(const ::testing::TestParamInfo<std::vector<int>>& info) {
  return fmt::format("Hosts{}", fmt::join(info.param, "_"));
}

class MultiNodeCollectivesTest : public MultiNodeJobTest,
                                 public ::testing::WithParamInterface<std::vector<int>> {};

// The combinations the acceptance asks for by name: the whole all-reduce grid, broadcast from
// the first and last ordinals and from a non-leader of a node other than 0, reduce-scatter's
// four cases, and at least one line of every other collective.
std::vector<std::string> required_names(const std::vector<int>& sizes) {
  std::vector<std::string> names;
  for (const char* dtype : {"f32", "f64", "bf16", "i32", "i64"}) {
    for (const char* op : {"sum", "mean", "max", "min"}) {
      for (int n : {0, 1, 7, 1023, 65553, 300007}) {
        names.push_back(fmt::format("all_reduce/{}/{}/n={}", dtype, op, n));
      }
    }
  }
  int world = 0, non_leader = -1;
  for (size_t node = 0; node < sizes.size(); ++node) {
    if (node > 0 && sizes[node] > 1 && non_leader < 0) non_leader = world + 1;
    world += sizes[node];
  }
  for (int root : {0, world - 1, non_leader}) {
    if (root >= 0) names.push_back(fmt::format("broadcast/root={}/i32/n=65553", root));
  }
  for (const char* rs : {"f32/sum", "f64/mean", "bf16/sum", "i64/max"}) {
    names.push_back(fmt::format("reduce_scatter/{}/n=300007", rs));
  }
  for (const char* other : {"all_gather/f64/n=300007", "all_gather_pieces/f32/n=65553",
                            "barrier/round=0", "rendezvous/round=0", "rendezvous/round=2"}) {
    names.push_back(other);
  }
  return names;
}

TEST_P(MultiNodeCollectivesTest, EveryCollectiveIsRightAndBitIdenticalOnEveryOrdinal) {
  const std::vector<int>& sizes = GetParam();
  const int hosts = static_cast<int>(sizes.size());
  NamespaceCluster cluster(hosts);
  const auto start = Clock::now();
  const std::vector<pid_t> launchers = start_job(cluster, "check", sizes, {kCollectivesCheck});
  const std::vector<std::optional<Exit>> exits = wait_all(launchers, kJobDeadline);
  std::cout << fmt::format("[ timing   ] {} hosts x {{{}}}: the job took {:.2f} s\n", hosts,
                           fmt::join(sizes, ","), seconds_between(start, Clock::now()));
  ASSERT_NO_FATAL_FAILURE(expect_all_succeeded(exits, "check"));

  std::vector<Fingerprints> per_ordinal;
  for (int host = 0, ordinal = 0; host < hosts; ++host) {
    for (int k = 0; k < sizes[static_cast<size_t>(host)]; ++k, ++ordinal) {
      per_ordinal.push_back(fingerprints(read_file(ordinal_log("check", host, ordinal))));
    }
  }
  const auto& reference = per_ordinal.front();
  std::map<std::string, std::string> by_name(reference.begin(), reference.end());
  for (const std::string& name : required_names(sizes)) {
    EXPECT_TRUE(by_name.contains(name)) << "ordinal 0 printed no line for " << name;
  }
  for (size_t o = 1; o < per_ordinal.size(); ++o) {
    EXPECT_EQ(differences(per_ordinal[o], reference), "")
        << "ordinal " << o << " against ordinal 0";
  }
  std::cout << fmt::format("[ checked  ] {} combinations on each of {} ordinals\n",
                           reference.size(), per_ordinal.size());
  expect_nothing_left(cluster);
}

INSTANTIATE_TEST_SUITE_P(Topologies, MultiNodeCollectivesTest,
                         ::testing::Values(std::vector<int>{2, 2}, std::vector<int>{1, 2, 1}),
                         topology_name);

// ---------------------------------------------------------------------------------------------
// Faults: 2 hosts x 2 replicas of train_fmnist, one fault on host 1 once training is under way.

// A job that trains until it is stopped: 64 steps an epoch, a progress line every 6 steps.
const std::vector<std::string> kEndlessTraining =
    concat({kTrainFmnist}, words("--model mlp --batch-size 16 --epochs 1000 --train-samples 4096 "
                                 "--test-samples 64 --no-eval --seed 7"));

class MultiNodeFaultTest : public MultiNodeJobTest {
 protected:
  void SetUp() override {
    MultiNodeJobTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    cluster_.emplace(2);
  }
  // The hosts go (with every process in them) before the logs they write to.
  void TearDown() override {
    cluster_.reset();
    MultiNodeJobTest::TearDown();
  }

  // Starts the job and returns once ordinal 0 has printed a progress line.
  void start_training(const EnvVars& env = {}) {
    const auto start = Clock::now();
    launchers_ = start_job(*cluster_, "train", {2, 2}, kEndlessTraining, {}, env);
    const std::string log = ordinal_log("train", 0, 0);
    ASSERT_TRUE(poll_until(
        [&] { return read_file(log).find(" samples/s ETA ") != std::string::npos; }, kJobDeadline))
        << "no progress line from ordinal 0:\n"
        << consoles("train", 2);
    std::cout << fmt::format("[ timing   ] training under way {:.2f} s after the launch\n",
                             seconds_between(start, Clock::now()));
  }

  // Waits for the launchers `hosts` after the fault at `fault`: each must exit with `code`
  // (the root cause's status, never 0), the last within `bound`. Prints node 0's launcher lines
  // and returns its console.
  std::string expect_stopped_within(const std::vector<int>& hosts, Clock::time_point fault,
                                    std::chrono::milliseconds bound, int code,
                                    const std::string& what) {
    std::vector<pid_t> pids;
    for (int h : hosts) pids.push_back(launchers_[static_cast<size_t>(h)]);
    const std::vector<std::optional<Exit>> exits = wait_all(pids, kJobDeadline);
    Clock::time_point last = fault;
    for (size_t i = 0; i < exits.size(); ++i) {
      EXPECT_TRUE(exits[i].has_value()) << "host " << hosts[i] << "'s xla-spawn still runs "
                                        << kJobDeadline.count() << " ms after " << what;
      if (!exits[i]) continue;
      last = std::max(last, exits[i]->at);
      EXPECT_TRUE(WIFEXITED(exits[i]->status) && WEXITSTATUS(exits[i]->status) == code)
          << "host " << hosts[i] << "'s xla-spawn " << describe_status(exits[i]->status)
          << " after " << what << ", expected exit code " << code;
      std::cout << fmt::format("[ fault    ] host {}'s xla-spawn {} {:.2f} s after {}\n", hosts[i],
                               describe_status(exits[i]->status),
                               seconds_between(fault, exits[i]->at), what);
    }
    const double seconds = seconds_between(fault, last);
    std::cout << fmt::format(
        "[ fault    ] {}: last exit {:.2f} s after the fault (bound {:.1f} s)\n", what, seconds,
        bound.count() / 1000.0);
    RecordProperty("fault_to_last_exit_ms", static_cast<int>(seconds * 1000));
    EXPECT_LT(last - fault, bound)
        << what << ": the last launcher exited " << seconds << " s after the fault";
    const std::string node0 = read_file(console("train", 0));
    std::cout << "[ summary  ] node 0's launcher lines:\n" << launcher_lines(node0);
    return node0;
  }

  // Node 0's summary gives `cause` as the root cause.
  void expect_root_cause(const std::string& node0, const std::string& cause) {
    const std::string line = root_cause_line(node0);
    EXPECT_NE(line.find(cause), std::string::npos)
        << "node 0's summary should name \"" << cause << "\" as the root cause; it says:\n"
        << launcher_lines(node0);
  }

  std::string node1_name() const {
    return fmt::format("node 1 (host {}, {})", cluster_->hostname(1), cluster_->addr(1));
  }

  // Host 1's link goes down for `outage` (at both ends, or at the switch's: `blackhole`) and
  // comes back: `settle` later both launchers still run, and the job trains on until it is
  // interrupted, no node having counted another lost.
  void expect_outage_ridden_out(std::chrono::milliseconds outage, bool blackhole,
                                std::chrono::milliseconds settle) {
    const std::string log = ordinal_log("train", 0, 0);
    const auto progress = [&] {
      const std::string text = read_file(log);
      size_t n = 0;
      for (size_t at = text.find(" samples/s ETA "); at != std::string::npos;
           at = text.find(" samples/s ETA ", at + 1)) {
        ++n;
      }
      return n;
    };
    const std::string what = fmt::format("a {:.1f} s outage", outage.count() / 1000.0);
    if (blackhole) {
      cluster_->blackhole_link(1);
    } else {
      cluster_->set_link(1, false);
    }
    std::this_thread::sleep_for(outage);
    cluster_->set_link(1, true);
    const auto back = Clock::now();
    std::this_thread::sleep_for(settle);
    for (const pid_t launcher : launchers_) {
      EXPECT_FALSE(wait_exit(launcher, 0ms).has_value())
          << "a launcher ended after " << what << ":\n" << consoles("train", 2);
    }
    const size_t lines = progress();
    EXPECT_TRUE(poll_until([&] { return progress() > lines; }, kJobDeadline))
        << "no progress since " << what << ":\n" << consoles("train", 2);
    std::cout << fmt::format("[ fault    ] training on {:.1f} s after {}\n",
                             seconds_between(back, Clock::now()), what);
    ASSERT_EQ(::kill(launchers_[0], SIGINT), 0) << errno_message("kill", errno);
    const std::vector<std::optional<Exit>> exits = wait_all(launchers_, kJobDeadline);
    for (const auto& exit : exits) {
      ASSERT_TRUE(exit.has_value()) << consoles("train", 2);
      EXPECT_TRUE(WIFEXITED(exit->status) && WEXITSTATUS(exit->status) == 130)
          << describe_status(exit->status);
    }
    for (int host = 0; host < 2; ++host) {
      EXPECT_EQ(read_file(console("train", host)).find("lost"), std::string::npos)
          << launcher_lines(read_file(console("train", host)));
    }
    expect_nothing_left(*cluster_);
  }

  std::optional<NamespaceCluster> cluster_;
  std::vector<pid_t> launchers_;
};

// A train_fmnist replica running in host `host`.
std::optional<pid_t> replica_on(const NamespaceCluster& cluster, int host) {
  for (const pid_t pid : cluster.pids(host)) {
    std::string comm = read_file(fmt::format("/proc/{}/comm", pid));
    if (comm == "train_fmnist\n") return pid;
  }
  return std::nullopt;
}

TEST_F(MultiNodeFaultTest, AReplicaKilledOnHostOneStopsEveryNodeWithinTenSeconds) {
  ASSERT_NO_FATAL_FAILURE(start_training());
  const std::optional<pid_t> victim = replica_on(*cluster_, 1);
  ASSERT_TRUE(victim.has_value()) << "no train_fmnist process in host 1";
  const std::string ordinal = environment_value(*victim, "XLA_SPAWN_ORDINAL");
  const std::string local = environment_value(*victim, "XLA_SPAWN_LOCAL_ORDINAL");
  const auto fault = Clock::now();
  ASSERT_EQ(::kill(*victim, SIGKILL), 0) << errno_message("kill", errno);
  const std::string node0 = expect_stopped_within({0, 1}, fault, scaled(10s), 128 + SIGKILL,
                                                  "SIGKILL of ordinal " + ordinal);
  expect_root_cause(node0,
                    fmt::format("ordinal {} (node 1, host {}, local ordinal {}) killed by signal 9",
                                ordinal, cluster_->hostname(1), local));
  expect_nothing_left(*cluster_);
}

TEST_F(MultiNodeFaultTest, HostOnesLauncherKilledStopsEveryNodeWithinTenSeconds) {
  ASSERT_NO_FATAL_FAILURE(start_training());
  const auto fault = Clock::now();
  ASSERT_EQ(::kill(launchers_[1], SIGKILL), 0) << errno_message("kill", errno);
  const std::string node0 =
      expect_stopped_within({0}, fault, scaled(10s), 1, "SIGKILL of host 1's xla-spawn");
  const std::optional<int> status = wait_exit(launchers_[1], kCleanupDeadline);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << describe_status(*status);
  expect_root_cause(node0, node1_name() + " lost: connection closed");
  expect_nothing_left(*cluster_);
}

TEST_F(MultiNodeFaultTest, HostOnesLinkDownStopsEveryNodeBeforeTheCollectiveDeadline) {
  ASSERT_NO_FATAL_FAILURE(start_training());
  const auto fault = Clock::now();
  cluster_->set_link(1, false);
  const std::string node0 =
      expect_stopped_within({0, 1}, fault, kCollectiveTimeout, 1, "host 1's link going down");
  expect_root_cause(node0, node1_name() + " lost: no heartbeat");
  std::cout << "[ summary  ] node 1's launcher lines:\n"
            << launcher_lines(read_file(console("train", 1)));
  EXPECT_NE(read_file(console("train", 1)).find("lost the master"), std::string::npos)
      << launcher_lines(read_file(console("train", 1)));
  expect_nothing_left(*cluster_);
}

// A link that comes back within a second and a half is ridden out at the default heartbeat
// timeout (5 s), past the timeout and the longest retransmission wait after it.
TEST_F(MultiNodeFaultTest, AShortLinkOutageIsRiddenOut) {
  ASSERT_NO_FATAL_FAILURE(start_training());
  expect_outage_ridden_out(1500ms, false, 8s);
}

// An outage of 9 s, beyond the host (its packets vanish), under a 12 s heartbeat timeout.
// TCP resends on the launchers' connections only when their backed-off timers fire (here
// about 6.5 s and then 13 s after the first lost beat), so the first beat after the outage
// used to arrive more than 12 s after the last one before it, and the silent node was counted
// lost. The liveness probe's new connections carry the news at once
// (cluster/liveness_probe.h). The replicas' collectives, which back off alike, are given a
// minute.
TEST_F(MultiNodeFaultTest, AnOutageThatTCPResendsTooLateForIsRiddenOutByTheProbe) {
  ASSERT_NO_FATAL_FAILURE(start_training({{"XLA_SPAWN_HEARTBEAT_TIMEOUT_MS", "12000"},
                                          {"XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", "60000"}}));
  expect_outage_ridden_out(9s, true, 12s);
  // The side whose beats TCP held back says so (the other side's may have come through).
  const std::string said = read_file(console("train", 0)) + read_file(console("train", 1));
  EXPECT_TRUE(said.find("node 1 answered on a new connection; its own had been silent for ") !=
                  std::string::npos ||
              said.find("answered on a new connection; this node's own had been silent for ") !=
                  std::string::npos)
      << launcher_lines(said);
}

// A firewall or NAT that forgets the launchers' connection while new ones still pass: the
// liveness probe stands in for it for two heartbeat timeouts (10 s) and no longer, since the
// orders on it would never arrive; then every node stops, naming the connection.
TEST_F(MultiNodeFaultTest, AConnectionAFirewallDroppedStopsEveryNodeNamingIt) {
  ASSERT_NO_FATAL_FAILURE(start_training());
  // Node 1's launcher's end of its connection to the master.
  const std::string sockets =
      cluster_->run(1, {"/usr/bin/ss", "-tnpH", "dport = :" + kMasterPort}).out;
  const std::string owner = fmt::format("pid={},", launchers_[1]);
  std::optional<uint16_t> port;
  for (const std::string& line : lines_of(sockets)) {
    if (line.find(owner) == std::string::npos) continue;
    const std::vector<std::string> fields = words(line);
    ASSERT_GE(fields.size(), 4u) << line;
    port = static_cast<uint16_t>(std::stoi(fields[3].substr(fields[3].rfind(':') + 1)));
  }
  ASSERT_TRUE(port.has_value()) << "no connection of pid " << launchers_[1] << ":\n" << sockets;
  const auto fault = Clock::now();
  if (!cluster_->hold_flow(1, *port)) GTEST_SKIP() << "this kernel has no htb qdisc (sch_htb)";
  const std::string node0 = expect_stopped_within({0, 1}, fault, scaled(20s), 1,
                                                  "a firewall holding node 1's connection");
  expect_root_cause(node0,
                    node1_name() + " lost: its connection to the master has carried nothing for ");
  const std::string node1 = read_file(console("train", 1));
  EXPECT_NE(node1.find("has carried nothing for "), std::string::npos) << launcher_lines(node1);
  EXPECT_NE(node1.find("answered on a new connection"), std::string::npos)
      << launcher_lines(node1);
  expect_nothing_left(*cluster_);
}

TEST_F(MultiNodeFaultTest, HostOnesLauncherStoppedStopsEveryNodeBeforeTheCollectiveDeadline) {
  ASSERT_NO_FATAL_FAILURE(start_training());
  const auto fault = Clock::now();
  ASSERT_EQ(::kill(launchers_[1], SIGSTOP), 0) << errno_message("kill", errno);
  const std::string node0 =
      expect_stopped_within({0}, fault, kCollectiveTimeout, 1, "SIGSTOP of host 1's xla-spawn");
  expect_root_cause(node0, node1_name() + " lost: no heartbeat");
  // Resumed, host 1's launcher finds the master gone and fails too.
  const auto resumed = Clock::now();
  ASSERT_EQ(::kill(launchers_[1], SIGCONT), 0) << errno_message("kill", errno);
  const std::optional<int> status = wait_exit(launchers_[1], kJobDeadline);
  ASSERT_TRUE(status.has_value()) << "host 1's xla-spawn still runs after SIGCONT:\n"
                                  << launcher_lines(read_file(console("train", 1)));
  std::cout << fmt::format("[ fault    ] host 1's xla-spawn {} {:.2f} s after SIGCONT\n",
                           describe_status(*status), seconds_between(resumed, Clock::now()));
  EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << launcher_lines(read_file(console("train", 1)));
  std::cout << "[ summary  ] node 1's launcher lines:\n"
            << launcher_lines(read_file(console("train", 1)));
  expect_nothing_left(*cluster_);
}

// ---------------------------------------------------------------------------------------------
// Restart: a replica on host 1 SIGKILLs itself; the job restarts on both hosts, resumes from
// the checkpoint and must end with the parameters (and optimizer state) of a clean run, byte
// for byte. The hosts share the filesystem (only /dev/shm is private), so both see the file.

std::vector<std::string> short_training(const std::string& checkpoint) {
  return concat({kTrainFmnist, "--checkpoint", checkpoint},
                words("--model mlp --batch-size 16 --epochs 1 --max-steps 12 --train-samples 2048 "
                      "--test-samples 64 --no-eval --seed 7 --checkpoint-every 3 --resume"));
}

TEST_F(MultiNodeJobTest, ARestartAcrossHostsEndsWithTheParametersOfACleanRun) {
  NamespaceCluster cluster(2);
  const std::string clean_checkpoint = path("clean.ckpt");
  const std::vector<std::optional<Exit>> clean =
      wait_all(start_job(cluster, "clean", {2, 2}, short_training(clean_checkpoint)), kJobDeadline);
  ASSERT_NO_FATAL_FAILURE(expect_all_succeeded(clean, "clean"));

  // The last ordinal (3, on host 1) kills itself before step 8; the checkpoint of step 6 holds.
  const std::string checkpoint = path("restarted.ckpt");
  std::vector<std::string> faulted = short_training(checkpoint);
  faulted.insert(faulted.end(), {"--fail-at-step", "8"});
  const std::vector<std::optional<Exit>> restarted = wait_all(
      start_job(cluster, "restarted", {2, 2}, faulted, {"--max-restarts", "1"}), kJobDeadline);
  ASSERT_NO_FATAL_FAILURE(expect_all_succeeded(restarted, "restarted"));
  const std::string node0 = read_file(console("restarted", 0));
  std::cout << "[ summary  ] node 0's launcher lines:\n" << launcher_lines(node0);
  EXPECT_NE(
      node0.find(fmt::format("ordinal 3 (node 1, host {}, local ordinal 1) killed by signal 9",
                             cluster.hostname(1))),
      std::string::npos)
      << launcher_lines(node0);
  for (int host = 0; host < 2; ++host) {
    EXPECT_NE(read_file(console("restarted", host))
                  .find("restarting all replicas of the job on every node: attempt 1"),
              std::string::npos)
        << "host " << host << ":\n"
        << launcher_lines(read_file(console("restarted", host)));
  }
  EXPECT_NE(read_file(ordinal_log("restarted", 0, 0)).find("resumed from " + checkpoint),
            std::string::npos)
      << read_file(ordinal_log("restarted", 0, 0));

  const std::string want = read_file(clean_checkpoint);
  ASSERT_FALSE(want.empty()) << "the clean run wrote no checkpoint";
  EXPECT_TRUE(read_file(checkpoint) == want)
      << "the restarted run's final checkpoint (" << read_file(checkpoint).size()
      << " bytes) differs from the clean run's (" << want.size() << " bytes)";
  expect_nothing_left(cluster);
}

// ---------------------------------------------------------------------------------------------
// Scale: 32 hosts of one replica each form a job and finish. The acceptance asks for the
// rendezvous and the run within 10 s, measured; the deadline here is only a generous ceiling
// (CI machines are loaded), the figure is printed and recorded.

TEST_F(MultiNodeJobTest, ThirtyTwoHostsOfOneReplicaFormAJobAndFinish) {
  constexpr int kHosts = 32;
  const auto up_start = Clock::now();
  NamespaceCluster cluster(kHosts);
  const double up_seconds = seconds_between(up_start, Clock::now());
  const std::vector<int> sizes(kHosts, 1);
  const auto start = Clock::now();
  const std::vector<std::optional<Exit>> exits =
      wait_all(start_job(cluster, "scale", sizes, {kCollectivesCheck, "--quick"}), kJobDeadline);
  Clock::time_point last = start;
  for (const std::optional<Exit>& e : exits) {
    if (e) last = std::max(last, e->at);
  }
  const double job_seconds = seconds_between(start, last);
  std::cout << fmt::format(
      "[ timing   ] {} hosts: cluster up in {:.2f} s; first launch to last exit {:.2f} s\n", kHosts,
      up_seconds, job_seconds);
  RecordProperty("first_launch_to_last_exit_ms", static_cast<int>(job_seconds * 1000));
  ASSERT_NO_FATAL_FAILURE(expect_all_succeeded(exits, "scale"));

  const auto reference = fingerprints(read_file(ordinal_log("scale", 0, 0)));
  EXPECT_FALSE(reference.empty()) << read_file(ordinal_log("scale", 0, 0));
  for (int o = 1; o < kHosts; ++o) {
    EXPECT_EQ(differences(fingerprints(read_file(ordinal_log("scale", o, o))), reference), "")
        << "ordinal " << o << " against ordinal 0";
  }
  expect_nothing_left(cluster);
}

}  // namespace
}  // namespace xs::testing
