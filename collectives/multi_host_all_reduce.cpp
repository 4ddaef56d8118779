// Hierarchical all-reduce: a local reduce by ranges, an all-reduce of each piece over its group
// (direct transfers, or gloo's ring for many nodes), a local gather (the algorithm is
// described in multi_host_communicator.h).
#include "collectives/detail/hierarchy.h"

namespace xs::detail {

// The network phase for up to max_direct_nodes nodes: each piece is split into one part per
// node, part j owned by node j; the members send their parts to the owners, which sum them in
// node order (NodeGroups::reduce_to_owners), and the owners send the sums back
// (send_from_owners). A group's pieces go as one batch, two rounds of transfers in all, where
// gloo's ring takes 2(H-1) steps of at most 1 MiB segments, each handed between its event loop
// and the caller.
void all_reduce_direct(const Hierarchy& h, std::byte* data, std::span<const CutPiece> pieces,
                       DType dtype, ReduceOp op) {
  const int nodes = h.topology.nnodes();
  std::vector<CutPiece> parts;
  std::vector<int> owners;
  for (const CutPiece& p : pieces) {
    for (int j = 0; j < nodes; ++j) {
      const size_t begin = p.count * static_cast<size_t>(j) / static_cast<size_t>(nodes);
      const size_t end = p.count * static_cast<size_t>(j + 1) / static_cast<size_t>(nodes);
      if (end == begin) continue;
      parts.push_back({p.offset + begin, end - begin, p.holders});
      owners.push_back(j);
    }
  }
  h.in_batches(
      parts, [&](const CutPiece& p) { return owners[static_cast<size_t>(&p - parts.data())]; },
      [&](std::span<const int> holders, std::span<const NodeGroups::OwnedPiece> batch) {
        h.groups.reduce_to_owners(holders, data, batch, dtype, op);
        h.groups.send_from_owners(holders, data, batch, dtype_size(dtype));
      });
}

// Hierarchical all-reduce schedule. The local reduce (sum for mean) leaves in this replica's
// range of `data` its node's reduction of that range. Each of the range's pieces, by
// increasing offset, is all-reduced over the piece's group (directly, or by gloo's ring
// beyond max_direct_nodes nodes), after which the range holds the job's reduction (mean:
// divided once, by the world size, here). The local gather then hands every range to the
// node's other replicas.
void multi_host_all_reduce(const Hierarchy& h, std::byte* data, size_t n_elems, DType dtype,
                           ReduceOp op) {
  const size_t elem_bytes = dtype_size(dtype);
  const ReduceOp partial = op == ReduceOp::kMean ? ReduceOp::kSum : op;
  const std::vector<size_t> cut = h.my_cut(n_elems, elem_bytes);
  h.locally(
      [&](ShmCommunicator& local) { local.reduce_ranges(data, n_elems, dtype, partial, cut); });
  const std::vector<CutPiece> pieces = h.my_pieces(n_elems, elem_bytes);
  if (h.topology.nnodes() <= h.max_direct_nodes) {
    all_reduce_direct(h, data, pieces, dtype, partial);
  } else {
    for (const CutPiece& p : pieces) {
      h.groups.all_reduce(p.holders, data + p.offset * elem_bytes, p.count, dtype, partial);
    }
  }
  if (op == ReduceOp::kMean) {
    const int me = h.topology.local_ordinal();
    divide(data + cut[me] * elem_bytes, cut[me + 1] - cut[me], dtype, h.topology.world_size());
  }
  h.locally([&](ShmCommunicator& local) { local.gather_ranges(data, n_elems, dtype, cut); });
}

}  // namespace xs::detail
