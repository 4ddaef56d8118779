#pragma once
// Who this replica is: ordinal, local ordinal, world size and the job it belongs to, read
// from the environment that xla-spawn (or spawn(fn)) gives each child. A binary started
// alone is ordinal 0 of 1 with no job. torchrun's RANK/LOCAL_RANK/WORLD_SIZE/LOCAL_WORLD_SIZE
// are accepted when the project's own variables are absent, so torchrun-style launches work.
//
//   const xs::ReplicaContext ctx = xs::ReplicaContext::from_env();
//   if (ctx.is_master()) save(...);

#include <string>

namespace xs {

// The environment contract between the launcher and its replicas.
namespace env_names {
inline constexpr const char* kOrdinal = "XLA_SPAWN_ORDINAL";
inline constexpr const char* kLocalOrdinal = "XLA_SPAWN_LOCAL_ORDINAL";
inline constexpr const char* kWorldSize = "XLA_SPAWN_WORLD_SIZE";
inline constexpr const char* kLocalWorldSize = "XLA_SPAWN_LOCAL_WORLD_SIZE";
inline constexpr const char* kJobId = "XLA_SPAWN_JOB_ID";
inline constexpr const char* kSegment = "XLA_SPAWN_SEGMENT";
inline constexpr const char* kAttempt = "XLA_SPAWN_ATTEMPT";
// torchrun's names, set alongside ours.
inline constexpr const char* kTorchRank = "RANK";
inline constexpr const char* kTorchLocalRank = "LOCAL_RANK";
inline constexpr const char* kTorchWorldSize = "WORLD_SIZE";
inline constexpr const char* kTorchLocalWorldSize = "LOCAL_WORLD_SIZE";
}  // namespace env_names

// Upper bound on world size: far above what one machine runs, low enough to catch typos.
inline constexpr int kMaxWorldSize = 1024;

struct ReplicaContext {
  int ordinal = 0;
  int local_ordinal = 0;
  int world_size = 1;
  int local_world_size = 1;
  int attempt = 0;           // 0 on the first run; k after the k-th --max-restarts restart
  std::string job_id;        // empty when started without a launcher
  std::string segment_name;  // the job's shared-memory segment; empty when standalone

  bool standalone() const { return job_id.empty(); }
  bool is_master() const { return ordinal == 0; }
  bool is_local_master() const { return local_ordinal == 0; }

  // Reads and validates the environment; throws xs::InvalidArgument naming the variable
  // when a value is not a number, negative, or inconsistent (ordinal >= world size).
  static ReplicaContext from_env();
};

}  // namespace xs
