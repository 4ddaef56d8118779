#pragma once
// This node's membership in a multi-node job, as the supervisor's JobPeers: joining (node 0
// first starts the rendezvous server), then heartbeats, failures and orders over the link to
// the master (cluster/node_link.h), and the environment that tells each replica where it
// sits and how to reach the others.
//
//   std::unique_ptr<xs::NodeSession> session =
//       xs::NodeSession::join(cl.nodes, cl.nprocs, 0, cl.command);
//   options.peers = session.get();
//   xs::supervise(cl.nprocs, body, options);

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "xla_spawn/cluster/node_link.h"
#include "xla_spawn/launcher/job_peers.h"
#include "xla_spawn/launcher/node_options.h"
#include "xla_spawn/launcher/rendezvous_process.h"

namespace xs {

// Heartbeats: a node (or the master) silent for this long is lost. 5 s stays under the
// 10 s within which every node must stop after a host vanishes, and far above the launcher's
// worst stall on a loaded machine.
inline constexpr const char* kHeartbeatTimeoutEnv = "XLA_SPAWN_HEARTBEAT_TIMEOUT_MS";
inline constexpr int64_t kDefaultHeartbeatTimeoutMs = 5000;

class NodeSession final : public JobPeers {
 public:
  // Starts the rendezvous server on node 0, then registers this node and waits (up to the
  // rendezvous timeout) for every node. Prints one progress line on entry and one when the job
  // has formed (and the master's note when nodes run different `command`s). Throws UsageError
  // for a --master-addr node 0 cannot listen on or a bad XLA_SPAWN_HOST_ADDR, Timeout or
  // PeerFailure when the job cannot form.
  static std::unique_ptr<NodeSession> join(const NodeOptions& options, int nprocs,
                                           int max_restarts,
                                           const std::vector<std::string>& command);

  const Placement& placement() const override { return placement_; }
  std::vector<EnvVar> env() const override;
  int fd() const override { return link_.fd(); }
  std::chrono::steady_clock::time_point deadline() const override {
    return link_.service_deadline();
  }
  std::optional<PeerStop> service() override;
  void local_failure(const LocalFailure& failure) override;
  PeerVerdict end_attempt(int attempt, int exit_code, int wake_fd = -1,
                          const WakeHandler& on_wake = {}) override;

  const cluster::World& world() const { return world_; }
  // The rendezvous server's process on node 0; -1 elsewhere.
  pid_t server_pid() const;

 private:
  NodeSession(const NodeOptions& options, cluster::NodeLink link,
              std::unique_ptr<RendezvousProcess> server);
  std::string ended_text(const cluster::JobOrder& order) const;

  NodeOptions options_;
  std::unique_ptr<RendezvousProcess> server_;  // node 0 only
  cluster::NodeLink link_;
  cluster::World world_;
  Placement placement_;
  std::string token_text_;
  std::string host_addr_;
  int attempt_ = 0;
};

}  // namespace xs
