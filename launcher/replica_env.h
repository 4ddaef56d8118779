#pragma once
// The environment each replica receives: the contract of replica/context.h (our names and
// torchrun's), the job id, the attempt number and whatever the job's resources add.
//
//   const std::string job = xs::make_job_id();                  // "xs-4242-9f3a1c07"
//   for (const auto& v : xs::replica_env(job, {.ordinal = 2, .local_ordinal = 2, .world_size = 8,
//                                              .local_world_size = 8}, 0, {})) ...  // RANK=2...

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace xs {

// One variable to set in a child; no value means unset it (so a job started from inside
// another job does not inherit the outer job's segment).
struct EnvVar {
  std::string name;
  std::optional<std::string> value;
};

// "xs-<launcher pid>-<8 hex digits>": unique per job; the pid lets a later launcher tell
// whether the job's launcher is still alive (stale resource sweeps).
std::string make_job_id();

// Defaults for the math libraries, each only where the launcher's own environment leaves the
// variable unset: one thread per replica (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS = 1, as
// torchrun does), and OPENBLAS_CORETYPE naming the CPU's real kernel class (SkylakeX on
// AVX-512, Haswell on AVX2), because under a hypervisor OpenBLAS often fails to recognise the
// CPU and falls back to its SSE3 kernels, about 4x slower at GEMM (docs/performance.md).
std::vector<EnvVar> compute_env_defaults();

// The replicas' own settings that every job reads and the launcher passes on unread (the log
// level, the collectives' timeout, spin and yield, XLA_SPAWN_DEBUG_REPLICAS), read here with
// the replicas' rules: UsageError naming the variable before anything starts, where every
// replica would fail with the same error, or, for the waits, only the first collective that
// waited long enough to read them. The collectives' and the runtime's choices
// (XLA_SPAWN_ALLREDUCE_ALGO, XLA_SPAWN_CODEGEN, ...) are read by the replicas that use them.
void check_replica_settings();

// Where one replica sits: in the job, and on its node (the same numbers on a single node).
struct ReplicaPlace {
  int ordinal = 0;
  int local_ordinal = 0;
  int world_size = 1;
  int local_world_size = 1;
};

// The variables for one replica: the contract, then compute_env_defaults(), then `extra`
// (from JobResources and, in a multi-node job, JobPeers). Everything that describes a job's
// nodes is set for a single node too (node 0 of 1), and XLA_SPAWN_SEGMENT is unset unless
// `extra` sets it, so a job started inside another job's replica inherits nothing of it.
std::vector<EnvVar> replica_env(const std::string& job_id, const ReplicaPlace& place, int attempt,
                                const std::vector<EnvVar>& extra);

// torch.distributed's env:// store address: MASTER_ADDR and MASTER_PORT as the user set them
// for this launcher, else `default_addr` and `pick_port()` (nullopt: leave the port unset). The
// port given is also marked in XLA_SPAWN_TORCH_PORT, so a launcher started inside the job
// (a replica running xla-spawn) knows an inherited MASTER_PORT is not its user's and picks its
// own: two jobs sharing a store would join each other's process groups.
std::vector<EnvVar> torch_store_env(const std::string& default_addr,
                                    const std::function<std::optional<uint16_t>()>& pick_port);

}  // namespace xs
