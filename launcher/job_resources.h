#pragma once
// The seam through which a job's shared resources (the shared-memory segment) are created
// before the replicas are forked and removed on every exit path of the supervisor.
//
//   class SegmentResources : public xs::JobResources { ... };   // shm layer
//   SegmentResources segment;  options.resources = &segment;   // sweep stale ones in its ctor
//
// Contract, per attempt (a --max-restarts restart is a new attempt of the same job):
//   prepare() runs in the parent before the attempt's first fork; the variables it returns
//   are set in every replica (e.g. XLA_SPAWN_SEGMENT). release() runs after every replica of
//   the attempt has been reaped, and also when the supervisor leaves by an exception or
//   after a signal; it may run more than once and must be idempotent and must not throw.
//   Only SIGKILL of the launcher skips release(); sweeping stale resources at the next start
//   (job ids carry the launcher's pid, see replica_env.h) covers that.

#include <string>
#include <vector>

#include "xla_spawn/launcher/replica_env.h"

namespace xs {

class JobResources {
 public:
  virtual ~JobResources() = default;
  virtual std::vector<EnvVar> prepare(const std::string& job_id, int world_size, int attempt) = 0;
  virtual void release() noexcept = 0;
};

}  // namespace xs
