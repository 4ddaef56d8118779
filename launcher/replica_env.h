#pragma once
// The environment each replica receives: the contract of replica/context.h (our names and
// torchrun's), the job id, the attempt number and whatever the job's resources add.
//
//   const std::string job = xs::make_job_id();                  // "xs-4242-9f3a1c07"
//   for (const auto& v : xs::replica_env(job, 2, 8, 0, {})) ...  // XLA_SPAWN_ORDINAL=2, RANK=2...

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
// CPU and falls back to its SSE3 kernels, about 4x slower at GEMM (README: "Runtime benchmarks").
std::vector<EnvVar> compute_env_defaults();

// The variables for `ordinal` of `world_size`: the contract, then compute_env_defaults(),
// then `extra` (from JobResources). XLA_SPAWN_SEGMENT is unset unless `extra` sets it.
std::vector<EnvVar> replica_env(const std::string& job_id, int ordinal, int world_size, int attempt,
                                const std::vector<EnvVar>& extra);

}  // namespace xs
