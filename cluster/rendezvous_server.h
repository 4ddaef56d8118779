#pragma once
// The rendezvous server of a multi-node job, run by the master node's xla-spawn in a process
// of its own: it accepts the launchers of every node and the replicas' store clients on the
// one address and port given (--master-addr, --master-port), authenticates each connection
// with the job token, runs the job's coordinator (cluster/coordinator.h) over the launchers'
// connections, exchanges heartbeats with them, and serves the key-value store through which
// gloo's contexts exchange addresses (cluster/store_client.h). One thread, non-blocking I/O
// with epoll; every client is bounded in what it may make the server hold (frame size before
// and after authentication, store bytes, connection count, time to authenticate).
//
//   xs::cluster::RendezvousServer server(xs::cluster::listen_on(addr, port), token, config);
//   const int exit_code = server.run();   // returns once the job has ended on every node

#include <chrono>
#include <cstdio>
#include <memory>

#include "xla_spawn/cluster/connection.h"
#include "xla_spawn/cluster/coordinator.h"
#include "xla_spawn/cluster/job_token.h"

namespace xs::cluster {

struct ServerConfig {
  CoordinatorConfig job;
  std::chrono::milliseconds heartbeat_interval{1000};
  // Silence after which a node counts as lost (frozen, stopped, or cut off).
  std::chrono::milliseconds heartbeat_timeout{5000};
  // A connection that has not authenticated by then is closed.
  std::chrono::milliseconds auth_timeout{10000};
  // After End: how long to wait for the nodes to read it and close before exiting.
  std::chrono::milliseconds linger{5000};
  size_t max_connections = 16384;
  size_t max_store_bytes = size_t{256} << 20;
  FILE* log = stderr;  // refusals and lost nodes, one line each (rate-limited)
  // While the job forms, where it stands (JobCoordinator::status) is logged this often (0:
  // never), and whenever `status_fd` (if not -1; the server drains it: a signalfd of
  // SIGUSR1, a pipe) becomes readable, at most once a second.
  std::chrono::milliseconds progress_interval{30000};
  int status_fd = -1;
};

class RendezvousServer {
 public:
  RendezvousServer(Fd listener, JobToken token, ServerConfig config);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  // Serves until the job has ended and every node has read End (or the linger time passed);
  // returns the job's exit code.
  int run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace xs::cluster
