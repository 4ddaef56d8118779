#pragma once
// The master node's rendezvous server (cluster/rendezvous_server.h), run in a process of its
// own that xla-spawn forks before anything else: the server answers the other nodes and the
// replicas' stores however busy the supervisor is, dies with xla-spawn (PR_SET_PDEATHSIG, so
// a killed master is seen by every node as a closed connection), and ignores the terminal's
// Ctrl-C, which xla-spawn itself turns into a job-wide interruption.
//
//   xs::RendezvousProcess server(xs::cluster::listen_on(addr, port), token, config);
//   ... the master's own NodeLink connects to addr:port like every other node ...
//   // ~RendezvousProcess waits (bounded) for it to exit after the job has ended

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>

#include "xla_spawn/cluster/connection.h"
#include "xla_spawn/cluster/job_token.h"
#include "xla_spawn/cluster/rendezvous_server.h"

namespace xs {

class RendezvousProcess {
 public:
  // Forks the server on `listener`; throws IoError when fork fails.
  RendezvousProcess(cluster::Fd listener, const cluster::JobToken& token,
                    const cluster::ServerConfig& config);
  // Waits up to the server's linger time plus a margin for it to exit, then SIGKILLs it.
  ~RendezvousProcess();
  RendezvousProcess(const RendezvousProcess&) = delete;
  RendezvousProcess& operator=(const RendezvousProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The running server's pid, for a signal handler to pass SIGUSR1 (where the rendezvous
  // stands) on to; 0 when there is none.
  static pid_t status_target();
  // The master leaves without the job's verdict (a second interrupt): no waiting on exit, the
  // other nodes see the connection close and stop.
  void leave_now() { wait_ms_ = 0; }
  // What became of the server when it no longer runs, waiting up to `wait` for its death to
  // show (a killed process's sockets close before it becomes a zombie); nullopt while it runs.
  // Leaves the status for the destructor to reap.
  struct Fate {
    // An exited server said its last word first (a refusal, the rendezvous timeout).
    enum class Kind { kExited, kKilled, kStopped };
    Kind kind = Kind::kExited;
    // "exited with code 1", "was killed by signal 9 (SIGKILL)", "is stopped by SIGSTOP"
    std::string text;
  };
  std::optional<Fate> gone(std::chrono::milliseconds wait) const;

 private:
  pid_t pid_ = -1;
  int wait_ms_ = 0;
};

}  // namespace xs
