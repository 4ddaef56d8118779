#pragma once
// Simulated hosts on this one machine for multi-node tests: a NamespaceCluster is a
// scripts/cluster cluster (one network, mount and UTS namespace per host: its own address
// 198.18.0.(k+1), /dev/shm and hostname), torn down with every process in it when the object
// goes, whatever the test did. Needs root; a test skips with the reason otherwise.
//
//   if (const auto why = xs::testing::namespace_cluster_unavailable()) GTEST_SKIP() << *why;
//   xs::testing::NamespaceCluster cluster(2);
//   const pid_t server = cluster.spawn(1, {"./server", cluster.addr(1)}, dir + "/server.log");
//   EXPECT_TRUE(cluster.run(0, {"./client", cluster.addr(1)}).ok());
//   const std::optional<int> status = xs::testing::wait_exit(server, std::chrono::seconds(10));

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace xs::testing {

// Why namespace clusters cannot be built here ("not root (uid 1000)", "no unshare on PATH",
// ...), or nullopt when they can: `scripts/cluster check`, asked once per process. Throws
// xs::IoError when the check itself fails in an unexpected way.
std::optional<std::string> namespace_cluster_unavailable();

struct ClusterOptions {
  std::string rate{};      // tbf rate on every host's eth0, e.g. "100mbit"; empty: unlimited
  std::string shm_size{};  // each host's /dev/shm, e.g. "256m"; empty: the script's 2g
};

struct CommandResult {
  int status = 0;  // wait status
  std::string out;
  std::string err;
  bool ok() const;  // exited with code 0
};

using EnvVars = std::vector<std::pair<std::string, std::string>>;

class NamespaceCluster {
 public:
  // `scripts/cluster up` under a name unique to this process and instance; throws xs::IoError
  // carrying the script's output when it fails, after whatever it built has been removed.
  explicit NamespaceCluster(int hosts, const ClusterOptions& options = {});
  // down(), then SIGKILLs and reaps every process spawn() started that is still unreaped.
  ~NamespaceCluster();
  NamespaceCluster(const NamespaceCluster&) = delete;
  NamespaceCluster& operator=(const NamespaceCluster&) = delete;

  const std::string& name() const { return name_; }
  int hosts() const { return hosts_; }
  std::string addr(int host) const;
  std::string hostname(int host) const;  // name()-h<host>

  // Starts argv as host `host` (argv[0] looked up on PATH; this process's cwd and
  // environment plus `extra_env`; stdin /dev/null; stdout and stderr to `log_path`, which is
  // truncated) and returns its pid: the command's own, a child of this process for the
  // caller to wait for (wait_exit). It gets SIGKILL if this process dies.
  pid_t spawn(int host, const std::vector<std::string>& argv, const std::string& log_path,
              const EnvVars& extra_env = {});
  // Runs argv as host `host` to completion (as spawn, but its stdout and stderr captured;
  // nothing it starts may keep them open). Throws xs::Timeout, after killing it and its
  // children, when it takes longer than `timeout` (used as given, not scaled).
  CommandResult run(int host, const std::vector<std::string>& argv,
                    std::chrono::milliseconds timeout = std::chrono::seconds(30)) const;

  void set_link(int host, bool up);               // both ends of host's veth
  void blackhole_link(int host);  // the switch's end only: set_link(host, true) restores it
  // Holds back, both ways, the TCP flow whose end in `host` is local port `port` (8 bit/s:
  // a firewall that forgot it); other flows pass. Lasts as long as the cluster. False when
  // the kernel cannot (no sch_htb).
  bool hold_flow(int host, uint16_t port);
  void shape(int host, const std::string& rate);  // tbf on eth0, e.g. "10mbit"; "none" removes it
  std::vector<pid_t> pids(int host) const;        // processes in the host's network namespace
  std::vector<std::string> shm_entries(int host) const;  // names in the host's /dev/shm
  std::pair<uint64_t, uint64_t> bytes(int host) const;   // tx_bytes, rx_bytes of eth0

  // `scripts/cluster down` now: kills every process in every host and removes the cluster.
  // Idempotent; throws xs::IoError with the script's output when it fails.
  void down();

 private:
  // `scripts/cluster ARGS...`; script_ok returns its stdout, or throws when it fails.
  CommandResult script(const std::vector<std::string>& args,
                       std::chrono::milliseconds timeout) const;
  std::string script_ok(const std::vector<std::string>& args) const;
  // `host` as the script's argument, after checking it is one of 0..hosts()-1.
  std::string host_arg(int host) const;

  std::string name_;
  int hosts_;
  bool up_ = false;
  std::vector<int> spawned_pidfds_;
};

// Waits for child `pid` to exit and reaps it: its wait status, or nullopt (still running,
// not reaped) after `timeout`.
std::optional<int> wait_exit(pid_t pid, std::chrono::milliseconds timeout);

// Polls `condition` every 5 ms until it holds or `timeout` passes; returns whether it held.
bool poll_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

}  // namespace xs::testing
