// Hierarchical reduce-scatter: a local reduce by ranges of the whole input, each piece reduced
// to the node whose block holds it (the pieces of a group all at once), a local gather of this
// node's block.
#include <algorithm>
#include <cstring>

#include "xla_spawn/collectives/detail/hierarchy.h"
#include "xla_spawn/collectives/reduce.h"

namespace xs::detail {

// Hierarchical reduce-scatter schedule. `work` holds world_size chunks of n_elems (ordinal
// k's at k * n_elems); node h's block is the chunks of its ordinals. The local reduce (sum for
// mean), by this node's cut of the whole buffer, leaves in each replica's range the node's
// reduction. The pieces are cut also at the blocks' boundaries, so each lies in one block, and
// each is reduced over its group to that block's node (NodeGroups::reduce_to_owners: a
// group's pieces in one batch, so each link carries partials both ways at once). Then
// each replica's range of its own node's block holds the job's reduction; a local gather of
// that block alone hands the ranges round the node, and each replica copies out its chunk
// (mean: divided by the world size).
void multi_host_reduce_scatter(const Hierarchy& h, std::byte* work, std::byte* out, size_t n_elems,
                               DType dtype, ReduceOp op) {
  const NodeTopology& t = h.topology;
  const size_t elem_bytes = dtype_size(dtype);
  const size_t total = n_elems * static_cast<size_t>(t.world_size());
  const ReduceOp partial = op == ReduceOp::kMean ? ReduceOp::kSum : op;
  const std::vector<size_t> cut = h.my_cut(total, elem_bytes);
  h.locally([&](ShmCommunicator& local) { local.reduce_ranges(work, total, dtype, partial, cut); });
  std::vector<size_t> block_starts;
  for (int node = 1; node < t.nnodes(); ++node) {
    block_starts.push_back(static_cast<size_t>(t.first_ordinal(node)) * n_elems);
  }
  h.in_batches(
      h.my_pieces(total, elem_bytes, block_starts),
      [&](const CutPiece& p) { return t.node_of(static_cast<int>(p.offset / n_elems)); },
      [&](std::span<const int> holders, std::span<const NodeGroups::OwnedPiece> batch) {
        h.groups.reduce_to_owners(holders, work, batch, dtype, partial);
      });
  // This node's block and each replica's range of it.
  const size_t begin = static_cast<size_t>(t.first_ordinal(t.node())) * n_elems;
  const size_t end = begin + static_cast<size_t>(t.local_world_size()) * n_elems;
  std::vector<size_t> block_cut(cut.size());
  for (size_t l = 0; l < cut.size(); ++l) block_cut[l] = std::clamp(cut[l], begin, end) - begin;
  h.locally([&](ShmCommunicator& local) {
    local.gather_ranges(work + begin * elem_bytes, end - begin, dtype, block_cut);
  });
  const std::byte* mine = work + static_cast<size_t>(t.ordinal()) * n_elems * elem_bytes;
  if (op == ReduceOp::kMean) {
    const void* sources[] = {mine};
    reduce_sources(out, nullptr, sources, 1, n_elems, dtype, ReduceOp::kMean, t.world_size());
  } else if (n_elems != 0) {
    std::memcpy(out, mine, n_elems * elem_bytes);
  }
}

}  // namespace xs::detail
