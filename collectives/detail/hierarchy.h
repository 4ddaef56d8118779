#pragma once
// The hierarchical schedules of MultiHostCommunicator (multi_host_communicator.h), one per
// file, each run by every replica of the job with the same arguments. The communicator
// validates arguments, stages operands into the buffer arena and breaks itself on failure;
// these functions take the operands as given and assume nothing about world size.
//
//   detail::Hierarchy hierarchy{topology, local.get(), groups};
//   detail::multi_host_all_reduce(hierarchy, data, n_elems, dtype, op);

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "xla_spawn/base/dtype.h"
#include "xla_spawn/collectives/detail/node_groups.h"
#include "xla_spawn/collectives/detail/node_pieces.h"
#include "xla_spawn/collectives/node_topology.h"
#include "xla_spawn/collectives/shm_communicator.h"

namespace xs::detail {

// What a schedule runs on: the job's shape, this node's shared-memory communicator and the
// cross-node groups.
struct Hierarchy {
  const NodeTopology& topology;
  ShmCommunicator* local;  // null when this node runs one replica: local phases are no-ops
  NodeGroups& groups;

  // Runs a local phase on this node's communicator (nothing without one). Its errors leave
  // as the same xs::Error type, prefixed with the call and the node's ordinals, since the
  // shared-memory layer names local ordinals.
  void locally(const std::function<void(ShmCommunicator&)>& phase) const;
  // This node's cut of an n_elems buffer, and this replica's pieces of it (node_pieces.h).
  std::vector<size_t> my_cut(size_t n_elems, size_t elem_bytes) const;
  std::vector<CutPiece> my_pieces(size_t n_elems, size_t elem_bytes,
                                  std::span<const size_t> extra_cuts = {}) const;
  // Calls `batch` once per maximal run of `pieces` (increasing offsets, tiling a range of the
  // buffer) that lie back to back and share their holders, each piece with its owner node.
  // Pieces tile the whole buffer across all replicas, so every member of a group meets the
  // same runs: a run is one step of the global order (node_groups.h), and its transfers can
  // all be in flight at once.
  using Batch = std::function<void(std::span<const int> holders,
                                   std::span<const NodeGroups::OwnedPiece> pieces)>;
  void in_batches(std::span<const CutPiece> pieces,
                  const std::function<int(const CutPiece&)>& owner, const Batch& batch) const;
};

// Mean's last step: divides `count` elements at `data` by `divisor` (reduce.h's arithmetic).
void divide(std::byte* data, size_t count, DType dtype, int divisor);

void multi_host_all_reduce(const Hierarchy& h, std::byte* data, size_t n_elems, DType dtype,
                           ReduceOp op);
// Its network phase alone: this replica's pieces of `data` (each its node's partial reduction,
// `op` without mean's division) all-reduced over their groups by gloo's ring.
void all_reduce_pieces(const Hierarchy& h, std::byte* data, size_t n_elems, DType dtype,
                       ReduceOp op);
void multi_host_broadcast(const Hierarchy& h, std::byte* data, size_t n_elems, DType dtype,
                          int root);
void multi_host_all_gather(const Hierarchy& h, const std::byte* in, std::byte* out, size_t n_elems,
                           DType dtype);
// `work` is a private copy of the world_size * n_elems input; it is clobbered.
void multi_host_reduce_scatter(const Hierarchy& h, std::byte* work, std::byte* out, size_t n_elems,
                               DType dtype, ReduceOp op);

struct RendezvousResult {
  std::vector<std::vector<std::byte>> payloads;  // by ordinal
  // Not empty when nodes passed different tags: the same message on every replica, which
  // throws it as xs::PeerFailure after the call (the communicator stays usable).
  std::string mismatch;
};
RendezvousResult multi_host_rendezvous(const Hierarchy& h, const std::string& tag,
                                       std::span<const std::byte> payload);

}  // namespace xs::detail
