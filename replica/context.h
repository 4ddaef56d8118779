#pragma once
// Who this replica is: ordinal, local ordinal, world size, its node and the job it belongs
// to, read from the environment that xla-spawn (or spawn(fn)) gives each child. A binary
// started alone is ordinal 0 of 1 with no job. torchrun's RANK/LOCAL_RANK/WORLD_SIZE/
// LOCAL_WORLD_SIZE are accepted when the project's own variables are absent, so
// torchrun-style launches work (as one node: the nodes of a job are xla-spawn's own).
//
//   const xs::ReplicaContext ctx = xs::ReplicaContext::from_env();
//   if (ctx.is_master()) save(...);

#include <string>
#include <vector>

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
// A multi-node job (one node: 0 of 1, the rest unset).
inline constexpr const char* kNode = "XLA_SPAWN_NODE";
inline constexpr const char* kNnodes = "XLA_SPAWN_NNODES";
inline constexpr const char* kNodeSizes = "XLA_SPAWN_NODE_SIZES";    // "2,2": replicas per node
inline constexpr const char* kMasterAddr = "XLA_SPAWN_MASTER_ADDR";  // the rendezvous server
inline constexpr const char* kMasterPort = "XLA_SPAWN_MASTER_PORT";
inline constexpr const char* kHostAddr = "XLA_SPAWN_HOST_ADDR";  // where this node's replicas listen
// torchrun's names, set alongside ours.
inline constexpr const char* kTorchRank = "RANK";
inline constexpr const char* kTorchLocalRank = "LOCAL_RANK";
inline constexpr const char* kTorchWorldSize = "WORLD_SIZE";
inline constexpr const char* kTorchLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kTorchGroupRank = "GROUP_RANK";
inline constexpr const char* kTorchGroupWorldSize = "GROUP_WORLD_SIZE";
inline constexpr const char* kTorchMasterAddr = "MASTER_ADDR";
inline constexpr const char* kTorchMasterPort = "MASTER_PORT";
inline constexpr const char* kTorchRunId = "TORCHELASTIC_RUN_ID";
inline constexpr const char* kTorchRestartCount = "TORCHELASTIC_RESTART_COUNT";
}  // namespace env_names

// Upper bounds: replicas on one node (far above what one machine runs, low enough to catch
// typos), nodes in a job, and so replicas in a job.
inline constexpr int kMaxLocalWorldSize = 1024;
inline constexpr int kMaxNodes = 4096;
inline constexpr int kMaxWorldSize = kMaxLocalWorldSize * kMaxNodes;

struct ReplicaContext {
  int ordinal = 0;
  int local_ordinal = 0;
  int world_size = 1;
  int local_world_size = 1;
  int attempt = 0;           // 0 on the first run; k after the k-th --max-restarts restart
  std::string job_id;        // empty when started without a launcher
  std::string segment_name;  // this node's shared-memory segment; empty when standalone
  // A multi-node job: this replica's node, every node's replica count (node order; global
  // ordinals are dense and ordered by node), the rendezvous server and this node's address.
  int node = 0;
  int nnodes = 1;
  std::vector<int> node_sizes;  // empty on a single node
  std::string master_addr;
  int master_port = 0;
  std::string host_addr;

  bool standalone() const { return job_id.empty(); }
  bool multi_node() const { return nnodes > 1; }
  bool is_master() const { return ordinal == 0; }
  bool is_local_master() const { return local_ordinal == 0; }
  // The job id this node's segment was created under (xs::segment_key below).
  std::string segment_key() const;

  // Reads and validates the environment; throws xs::InvalidArgument naming the variable
  // when a value is not a number, negative, or inconsistent (ordinal >= world size, node
  // sizes that do not add up to the world size or do not place the ordinal on its node).
  static ReplicaContext from_env();
};

// The job id a node's segment is created under: the job's own on a single node, with the node
// appended in a multi-node job, so nodes that share a machine (and /dev/shm) never collide.
// Inline: the launcher, which does not link the replica library, names segments this way too.
inline std::string segment_key(const std::string& job_id, int node, int nnodes) {
  return nnodes > 1 ? job_id + "-n" + std::to_string(node) : job_id;
}

inline std::string ReplicaContext::segment_key() const {
  return xs::segment_key(job_id, node, nnodes);
}

}  // namespace xs
