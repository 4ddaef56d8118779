// The namespace cluster tooling checked for real: scripts/cluster through
// tests/support/namespace_cluster.h builds hosts that reach each other over TCP, have their
// own /dev/shm, hostname and interfaces, can be cut off, rate limited and counted, and leave
// nothing behind. Every test skips, saying why, where clusters cannot be built (not root).

#include "tests/support/namespace_cluster.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "tests/support/deadline_scale.h"
#include "tests/support/scoped_env.h"

namespace xs::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kProbe = XS_TCP_PROBE_PATH;
const std::string kPort = "5000";  // every host has its own ports: any fixed one will do

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Output of a shell command line run in this (the machine's) namespaces.
std::string shell_output(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  if (!pipe) throw IoError(errno_message("popen " + command, errno));
  std::string out;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe.get())) > 0;) out.append(buffer, n);
  return out;
}

// What the tcp_probe answer line "<hostname> <bytes> <seconds>" says.
struct Answer {
  std::string hostname;
  uint64_t bytes = 0;
  double seconds = 0;
};

Answer parse_answer(const std::string& line) {
  Answer a;
  std::istringstream in(line);
  if (!(in >> a.hostname >> a.bytes >> a.seconds)) {
    ADD_FAILURE() << "tcp_probe answer '" << line << "': expected <hostname> <bytes> <seconds>";
  }
  return a;
}

// Logs in a fresh directory per test; skips the test where clusters cannot be built.
class NamespaceClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const auto why = namespace_cluster_unavailable()) GTEST_SKIP() << *why;
    std::string pattern = (std::filesystem::temp_directory_path() / "xs-cluster-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << errno_message("mkdtemp " + pattern, errno);
    log_dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;  // a test that skipped has no directory
    std::filesystem::remove_all(log_dir_, ignored);
  }

  std::string log(const std::string& name) const { return log_dir_ + "/" + name + ".log"; }

  // Starts a tcp_probe listener on host `host` serving `connections`, and waits until it
  // listens.
  pid_t start_listener(NamespaceCluster& cluster, int host, int connections,
                       std::chrono::milliseconds timeout = 20s) {
    const std::string path = log("listener-" + std::to_string(host));
    const pid_t pid = cluster.spawn(
        host,
        {kProbe, "listen", cluster.addr(host), kPort, "--accept", std::to_string(connections),
         "--timeout-ms", std::to_string(scaled(timeout).count())},
        path);
    const bool listening =
        poll_until([&] { return read_file(path).starts_with("listening"); }, scaled(10s));
    EXPECT_TRUE(listening) << "listener on host " << host
                           << " not ready after 10 s: " << read_file(path);
    return pid;
  }

  // Connects from host `from` to host `to`'s listener and sends `bytes`.
  static CommandResult connect(const NamespaceCluster& cluster, int from, int to,
                               uint64_t bytes = 0, std::chrono::milliseconds timeout = 10s) {
    const auto t = scaled(timeout);
    return cluster.run(from,
                       {kProbe, "connect", cluster.addr(to), kPort, "--send-bytes",
                        std::to_string(bytes), "--timeout-ms", std::to_string(t.count())},
                       t + 10s);
  }

  void expect_exit_0(pid_t pid, const std::string& what, const std::string& log_path) {
    const std::optional<int> status = wait_exit(pid, scaled(30s));
    ASSERT_TRUE(status.has_value()) << what << " still running after 30 s: " << read_file(log_path);
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << what << " ended with wait status " << *status << ": " << read_file(log_path);
  }

 private:
  std::string log_dir_;
};

TEST_F(NamespaceClusterTest, TwoHostsTalkOverTcp) {
  NamespaceCluster cluster(2);
  const pid_t listener = start_listener(cluster, 1, 1);
  const CommandResult r = connect(cluster, 0, 1, 100000);
  ASSERT_TRUE(r.ok()) << r.err;
  const Answer answer = parse_answer(r.out);
  EXPECT_EQ(answer.hostname, cluster.hostname(1));
  EXPECT_EQ(answer.bytes, 100000u);
  expect_exit_0(listener, "listener", log("listener-1"));
}

TEST_F(NamespaceClusterTest, DevShmIsPrivateToEachHost) {
  NamespaceCluster cluster(2);
  const std::string file = "xs-probe-" + cluster.name();
  const CommandResult r = cluster.run(0, {"touch", "/dev/shm/" + file});
  ASSERT_TRUE(r.ok()) << r.err;
  const std::vector<std::string> host0 = cluster.shm_entries(0);
  const std::vector<std::string> host1 = cluster.shm_entries(1);
  EXPECT_NE(std::find(host0.begin(), host0.end(), file), host0.end());
  EXPECT_EQ(std::find(host1.begin(), host1.end(), file), host1.end());
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + file)) << "visible outside the cluster";
}

TEST_F(NamespaceClusterTest, EachHostHasItsOwnHostname) {
  NamespaceCluster cluster(3);
  for (int k = 0; k < cluster.hosts(); ++k) {
    const CommandResult r = cluster.run(k, {"uname", "-n"});
    ASSERT_TRUE(r.ok()) << r.err;
    EXPECT_EQ(r.out, cluster.hostname(k) + "\n") << "host " << k;
  }
  EXPECT_NE(shell_output("uname -n"), cluster.hostname(0) + "\n") << "the machine's changed";
}

TEST_F(NamespaceClusterTest, EachHostSeesOnlyItsOwnInterfacesInSysfs) {
  NamespaceCluster cluster(2);
  const CommandResult r = cluster.run(1, {"ls", "/sys/class/net"});
  ASSERT_TRUE(r.ok()) << r.err;
  EXPECT_EQ(r.out, "eth0\nlo\n");
}

TEST_F(NamespaceClusterTest, SpawnKeepsThePidCwdAndEnvironmentOfTheCaller) {
  NamespaceCluster cluster(2);
  const std::string path = log("shell");
  const pid_t pid = cluster.spawn(1, {"sh", "-c", "echo $$ \"$PWD\" \"$XS_PROBE_VALUE\""}, path,
                                  {{"XS_PROBE_VALUE", "forty two"}});
  expect_exit_0(pid, "sh", path);
  EXPECT_EQ(read_file(path),
            std::to_string(pid) + " " + std::filesystem::current_path().string() + " forty two\n");
}

TEST_F(NamespaceClusterTest, LinkDownCutsTheConnectionAndLinkUpRestoresIt) {
  NamespaceCluster cluster(2);
  const pid_t listener = start_listener(cluster, 1, 2, 60s);
  const CommandResult before = connect(cluster, 0, 1);
  ASSERT_TRUE(before.ok()) << before.err;

  cluster.set_link(1, false);
  // 1 s: far above a connect over a bridge on one machine (< 1 ms), short enough to wait out.
  const CommandResult cut = connect(cluster, 0, 1, 0, 1s);
  EXPECT_FALSE(cut.ok()) << "connected over a link that is down: " << cut.out;

  cluster.set_link(1, true);
  CommandResult after;
  const bool restored = poll_until(
      [&] {
        after = connect(cluster, 0, 1, 0, 1s);
        return after.ok();
      },
      scaled(10s));
  EXPECT_TRUE(restored) << "no connection 10 s after link up: " << after.err;
  expect_exit_0(listener, "listener", log("listener-1"));
}

TEST_F(NamespaceClusterTest, RateLimitsEachHostUntilShapeRemovesIt) {
  // 8 Mbit/s: 1 MB takes 1 s once the 64 KiB burst is spent, so 0.8 s is a safe lower bound.
  NamespaceCluster cluster(2, {.rate = "8mbit"});
  constexpr uint64_t kBytes = 1000000;
  const pid_t listener = start_listener(cluster, 1, 2, 60s);
  const CommandResult shaped = connect(cluster, 0, 1, kBytes);
  ASSERT_TRUE(shaped.ok()) << shaped.err;
  EXPECT_GE(parse_answer(shaped.out).seconds, 0.8) << shaped.out;

  cluster.shape(0, "none");
  const CommandResult unshaped = connect(cluster, 0, 1, kBytes);
  ASSERT_TRUE(unshaped.ok()) << unshaped.err;
  // Unshaped, 1 MB crosses a veth in milliseconds; 0.5 s leaves room for a loaded machine.
  EXPECT_LT(parse_answer(unshaped.out).seconds, 0.5) << unshaped.out;
  expect_exit_0(listener, "listener", log("listener-1"));
}

TEST_F(NamespaceClusterTest, BytesCountsTheTrafficOfEth0) {
  NamespaceCluster cluster(2);
  constexpr uint64_t kBytes = 1000000;
  const pid_t listener = start_listener(cluster, 1, 1);
  const auto [tx0, rx0] = cluster.bytes(0);
  const auto [tx1, rx1] = cluster.bytes(1);
  const CommandResult r = connect(cluster, 0, 1, kBytes);
  ASSERT_TRUE(r.ok()) << r.err;
  expect_exit_0(listener, "listener", log("listener-1"));
  // Payload plus headers; nothing else talks (no IPv6 chatter), so at most a few % more.
  EXPECT_GE(cluster.bytes(0).first - tx0, kBytes);
  EXPECT_LT(cluster.bytes(0).first - tx0, kBytes * 11 / 10);
  EXPECT_GE(cluster.bytes(1).second - rx1, kBytes);
  EXPECT_LT(cluster.bytes(0).second - rx0, kBytes / 10) << "host 0 received mostly ACKs";
  EXPECT_LT(cluster.bytes(1).first - tx1, kBytes / 10) << "host 1 sent mostly ACKs";
}

TEST_F(NamespaceClusterTest, PidsListsTheProcessesOfOneHost) {
  NamespaceCluster cluster(2);
  const pid_t sleeper = cluster.spawn(1, {"sleep", "600"}, log("sleep"));
  const auto listed = [&](int host) {
    const std::vector<pid_t> pids = cluster.pids(host);
    return std::find(pids.begin(), pids.end(), sleeper) != pids.end();
  };
  // spawn() returns while `scripts/cluster run` is still on its way into the host.
  EXPECT_TRUE(poll_until([&] { return listed(1); }, scaled(10s)));
  EXPECT_FALSE(listed(0));
}

// Nothing of the clusters whose names start with `prefix` is left in the machine: no
// namespace, state directory, mount or `scripts/cluster list` line.
void expect_nothing_left(const std::string& prefix) {
  std::istringstream netns(shell_output("ip netns list"));
  for (std::string line; std::getline(netns, line);) {
    EXPECT_FALSE(line.starts_with(prefix)) << "namespace left: " << line;
  }
  std::istringstream list(shell_output(std::string(XS_CLUSTER_SCRIPT) + " list"));
  for (std::string line; std::getline(list, line);) {
    EXPECT_FALSE(line.starts_with(prefix)) << "cluster listed: " << line;
  }
  std::error_code missing;  // no /run/xs-cluster at all is fine
  for (const auto& entry : std::filesystem::directory_iterator("/run/xs-cluster", missing)) {
    const std::string state = entry.path().filename().string();
    EXPECT_FALSE(state.starts_with(prefix)) << "state directory left: " << entry.path();
  }
  EXPECT_EQ(read_file("/proc/self/mountinfo").find("/run/xs-cluster/" + prefix), std::string::npos);
}

TEST_F(NamespaceClusterTest, DownKillsEveryProcessAndLeavesNothingBehind) {
  NamespaceCluster cluster(2);
  std::vector<pid_t> sleepers;
  for (int k = 0; k < cluster.hosts(); ++k) {
    sleepers.push_back(cluster.spawn(k, {"sleep", "600"}, log("sleep-" + std::to_string(k))));
    const auto inside = [&] {
      const std::vector<pid_t> pids = cluster.pids(k);
      return std::find(pids.begin(), pids.end(), sleepers.back()) != pids.end();
    };
    ASSERT_TRUE(poll_until(inside, scaled(10s))) << "sleep not in host " << k;
  }
  cluster.down();
  for (const pid_t pid : sleepers) {
    const std::optional<int> status = wait_exit(pid, scaled(10s));
    ASSERT_TRUE(status.has_value()) << "pid " << pid << " survived down";
    EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << *status;
  }
  expect_nothing_left(cluster.name());
  EXPECT_NO_THROW(cluster.down()) << "a second down";
}

// Every cluster name this process makes starts so (see unique_name in namespace_cluster.cpp),
// and by the time these checks run none of the others is up.
std::string this_process_prefix() {
  return "t" + std::to_string(::getpid()) + "x";
}

TEST_F(NamespaceClusterTest, UpThatFailsHalfWayRemovesWhatItBuilt) {
  const ScopedEnv fault("XS_CLUSTER_TEST_FAULT", "fail-at-host:1");
  EXPECT_THROW(NamespaceCluster(3), IoError);
  expect_nothing_left(this_process_prefix());
}

TEST_F(NamespaceClusterTest, DownRemovesWhatAKilledUpBuilt) {
  // The script SIGKILLs itself after host 1; the constructor's down() must remove the rest.
  const ScopedEnv fault("XS_CLUSTER_TEST_FAULT", "kill-at-host:1");
  try {
    NamespaceCluster cluster(3);
    ADD_FAILURE() << "up succeeded despite XS_CLUSTER_TEST_FAULT";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("killed by signal 9"), std::string::npos) << e.what();
  }
  expect_nothing_left(this_process_prefix());
}

TEST_F(NamespaceClusterTest, UpRejectsBadArgumentsWithTheScriptsMessage) {
  try {
    NamespaceCluster cluster(65);
    ADD_FAILURE() << "65 hosts accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("host count '65': expected 1..64"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(NamespaceCluster(2, {.rate = "fast"}), IoError);
}

// /proc/self/status's SigQ line counts the signals queued for this user on the whole machine,
// so its length changes whenever a count crosses a power of ten; the script used to read the
// file line by line (every line a fresh copy of the text) and then missed CapEff and refused
// to run a host's command as root, now and then, in a loaded CI run.
TEST_F(NamespaceClusterTest, CheckSeesRootsCapabilitiesWhileSignalsAreQueuedAndTaken) {
  const pid_t parent = ::getpid();
  const pid_t queuer = ::fork();
  ASSERT_GE(queuer, 0) << errno_message("fork", errno);
  if (queuer == 0) {  // keeps between 0 and 12 signals queued: SigQ flips between 1 and 2 digits
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigset_t rt;
    ::sigemptyset(&rt);
    ::sigaddset(&rt, SIGRTMIN);
    ::sigprocmask(SIG_BLOCK, &rt, nullptr);
    const sigval value{};
    for (int round = 0; round < 10'000'000 && ::getppid() == parent; ++round) {
      for (int k = 0; k < 12; ++k) ::sigqueue(::getpid(), SIGRTMIN, value);
      for (int k = 0, sig = 0; k < 12; ++k) ::sigwait(&rt, &sig);
    }
    ::_exit(0);
  }
  // The old read refused about one check in five with this running beside it.
  int refused = 0;
  std::string last;
  for (int k = 0; k < 100; ++k) {
    const std::string out = shell_output(std::string(XS_CLUSTER_SCRIPT) + " check 2>&1");
    if (out != "cluster: namespace clusters can be built here\n") {
      ++refused;
      last = out;
    }
  }
  ::kill(queuer, SIGKILL);
  ::waitpid(queuer, nullptr, 0);
  EXPECT_EQ(refused, 0) << "of 100 checks; the last said: " << last;
}

TEST_F(NamespaceClusterTest, ThirtyTwoHostsComeUpAndEveryHostReachesHostZero) {
  constexpr int kHosts = 32;
  const auto start = Clock::now();
  NamespaceCluster cluster(kHosts);
  const double up_seconds = seconds_since(start);

  const auto talk_start = Clock::now();
  const pid_t listener = start_listener(cluster, 0, kHosts - 1, 60s);
  const std::string host0 = cluster.addr(0);
  std::vector<pid_t> clients;
  for (int k = 1; k < kHosts; ++k) {
    clients.push_back(cluster.spawn(
        k, {kProbe, "connect", host0, kPort, "--timeout-ms", std::to_string(scaled(30s).count())},
        log("client-" + std::to_string(k))));
  }
  for (int k = 1; k < kHosts; ++k) {
    const std::string path = log("client-" + std::to_string(k));
    expect_exit_0(clients[k - 1], "client on host " + std::to_string(k), path);
    EXPECT_EQ(parse_answer(read_file(path)).hostname, cluster.hostname(0)) << "host " << k;
  }
  expect_exit_0(listener, "listener", log("listener-0"));
  const double talk_seconds = seconds_since(talk_start);

  const auto down_start = Clock::now();
  cluster.down();
  const double down_seconds = seconds_since(down_start);
  std::printf("%d hosts: up %.2f s, every host reached host 0 in %.2f s, down %.2f s\n", kHosts,
              up_seconds, talk_seconds, down_seconds);
  RecordProperty("up_ms", static_cast<int>(up_seconds * 1000));
  RecordProperty("down_ms", static_cast<int>(down_seconds * 1000));
}

}  // namespace
}  // namespace xs::testing
