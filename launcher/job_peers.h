#pragma once
// The other nodes of a multi-node job, as one node's supervisor sees them: where this node's
// replicas sit in the job, what to add to their environment, a file descriptor to poll beside
// them, this node's failures to pass on, and the job-wide orders that come back (stop the
// attempt; restart; end with this status). launcher/node_session.h implements it over the
// rendezvous link; a single-node job has none (SupervisorOptions::peers is null).
//
//   if (std::optional<xs::PeerStop> stop = peers->service()) stop_replicas(stop->reason);
//   peers->local_failure({.local_ordinal = 2, .kind = xs::LocalFailureKind::kSignalled, ...});
//   const xs::PeerVerdict v = peers->end_attempt(attempt, exit_code);   // restart or end

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "xla_spawn/launcher/replica_env.h"

namespace xs {

// Where this node's replicas sit: ordinals first_ordinal .. first_ordinal + nprocs - 1 of
// world_size, on node `node` of `nnodes`, in job `job_id` (the same on every node).
struct Placement {
  std::string job_id;
  int node = 0;
  int nnodes = 1;
  int first_ordinal = 0;
  int world_size = 0;
};

enum class LocalFailureKind { kExited, kSignalled, kTimedOut, kInterrupted, kLauncherError };

struct LocalFailure {
  int local_ordinal = -1;  // -1 when no replica is to blame (a timeout, a signal to xla-spawn)
  LocalFailureKind kind = LocalFailureKind::kExited;
  int exit_code = 1;        // what xla-spawn exits with if this is the job's root cause
  std::string description;  // "exited with code 3", "was interrupted by SIGINT"
  std::vector<std::string> tail;
};

// Stop this node's attempt. `job_over`: the job has ended meanwhile (the master was lost, or
// ended it): exit with `exit_code` and print `summary` without asking again.
struct PeerStop {
  std::string reason;
  bool job_over = false;
  int exit_code = 0;
  std::string summary;
};

// After an attempt: restart as attempt `attempt` (summary: the failed attempt's root cause as
// node 0 judged it), or end with `exit_code` (summary empty on success).
struct PeerVerdict {
  bool restart = false;
  int attempt = 0;
  int exit_code = 0;
  std::string summary;
};

class JobPeers {
 public:
  virtual ~JobPeers() = default;
  virtual const Placement& placement() const = 0;
  // Added to every replica's environment: the node, the master, this node's address, ...
  virtual std::vector<EnvVar> env() const = 0;
  virtual int fd() const = 0;  // poll for input; -1 when there is nothing to poll
  // service() must run by then at the latest (heartbeats, silence of the master).
  virtual std::chrono::steady_clock::time_point deadline() const = 0;
  virtual std::optional<PeerStop> service() = 0;
  virtual void local_failure(const LocalFailure& failure) = 0;
  // This node's attempt is over (exit_code 0: every replica exited 0); blocks until the job
  // decides. When `wake_fd` (if not -1) becomes readable meanwhile, calls `on_wake`, whose
  // verdict, if any, ends the wait (the supervisor's signals: the job may run on elsewhere
  // for long).
  using WakeHandler = std::function<std::optional<PeerVerdict>()>;
  virtual PeerVerdict end_attempt(int attempt, int exit_code, int wake_fd = -1,
                                  const WakeHandler& on_wake = {}) = 0;
};

}  // namespace xs
