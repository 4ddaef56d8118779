// Hierarchical all-reduce: a local reduce by ranges, gloo's all-reduce of each piece over its
// group (NodeGroups::all_reduce: bcube between two nodes, the ring among more), a local gather (the algorithm is described in multi_host_communicator.h).
#include "xla_spawn/collectives/detail/hierarchy.h"

namespace xs::detail {

// Each piece goes through gloo's all-reduce rather than the direct transfers of
// reduce-scatter and all-gather (NodeGroups::reduce_to_owners, send_from_owners): the ring was
// as fast as those on a link faster than TCP's CPU cost, and faster on a slower one.
void all_reduce_pieces(const Hierarchy& h, std::byte* data, size_t n_elems, DType dtype,
                       ReduceOp op) {
  const size_t elem_bytes = dtype_size(dtype);
  for (const CutPiece& p : h.my_pieces(n_elems, elem_bytes)) {
    h.groups.all_reduce(p.holders, data + p.offset * elem_bytes, p.count, dtype, op);
  }
}

// Hierarchical all-reduce schedule. The local reduce (sum for mean) leaves in this replica's
// range of `data` its node's reduction of that range. Each of the range's pieces, by
// increasing offset, is all-reduced over the piece's group, after which the range holds the
// job's reduction (mean: divided once, by the world size, here). The local gather then hands
// every range to the node's other replicas.
void multi_host_all_reduce(const Hierarchy& h, std::byte* data, size_t n_elems, DType dtype,
                           ReduceOp op) {
  const size_t elem_bytes = dtype_size(dtype);
  const ReduceOp partial = op == ReduceOp::kMean ? ReduceOp::kSum : op;
  const std::vector<size_t> cut = h.my_cut(n_elems, elem_bytes);
  h.locally(
      [&](ShmCommunicator& local) { local.reduce_ranges(data, n_elems, dtype, partial, cut); });
  all_reduce_pieces(h, data, n_elems, dtype, partial);
  if (op == ReduceOp::kMean) {
    const int me = h.topology.local_ordinal();
    divide(data + cut[me] * elem_bytes, cut[me + 1] - cut[me], dtype, h.topology.world_size());
  }
  h.locally([&](ShmCommunicator& local) { local.gather_ranges(data, n_elems, dtype, cut); });
}

}  // namespace xs::detail
