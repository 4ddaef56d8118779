// Hierarchical all-gather: a local all-gather into the node's block of the output, each
// node's block sent piece by piece from that node (a group's pieces of every block at once),
// local gathers of the other blocks.
#include <cstring>

#include "xla_spawn/collectives/detail/hierarchy.h"

namespace xs::detail {

// Hierarchical all-gather schedule. Node h's block of `out` holds the inputs of its ordinals
// first(h) .. first(h) + L_h - 1; its replicas fill it with a local all-gather. Then each
// block is cut into pieces like any buffer of L_h * n_elems elements, and every piece goes
// over its group from the block's node (NodeGroups::send_from_owners: the pieces of all
// blocks, in output order, batched by group, so each link carries blocks both ways at once);
// afterwards on every other node each replica holds its range of the block. Last, each node
// gathers the other nodes' blocks locally, block by block.
void multi_host_all_gather(const Hierarchy& h, const std::byte* in, std::byte* out, size_t n_elems,
                           DType dtype) {
  const NodeTopology& t = h.topology;
  const size_t elem_bytes = dtype_size(dtype);
  auto block = [&](int node) {
    return out + static_cast<size_t>(t.first_ordinal(node)) * n_elems * elem_bytes;
  };
  auto block_elems = [&](int node) { return static_cast<size_t>(t.node_size(node)) * n_elems; };
  if (h.local == nullptr) {
    if (block(t.node()) != in) std::memmove(block(t.node()), in, n_elems * elem_bytes);
  }
  h.locally([&](ShmCommunicator& local) { local.all_gather(in, block(t.node()), n_elems, dtype); });
  // Every block's pieces with their offsets in `out`; a piece's owner is its block's node, the
  // node of the ordinal whose chunk it lies in (as in the reduce-scatter).
  std::vector<CutPiece> pieces;
  for (int node = 0; node < t.nnodes(); ++node) {
    const size_t start = static_cast<size_t>(t.first_ordinal(node)) * n_elems;
    for (CutPiece& p : h.my_pieces(block_elems(node), elem_bytes)) {
      p.offset += start;
      pieces.push_back(std::move(p));
    }
  }
  h.in_batches(
      pieces, [&](const CutPiece& p) { return t.node_of(static_cast<int>(p.offset / n_elems)); },
      [&](std::span<const int> holders, std::span<const NodeGroups::OwnedPiece> batch) {
        h.groups.send_from_owners(holders, out, batch, elem_bytes);
      });
  for (int node = 0; node < t.nnodes(); ++node) {
    if (node == t.node()) continue;
    const std::vector<size_t> cut = h.my_cut(block_elems(node), elem_bytes);
    h.locally([&](ShmCommunicator& local) {
      local.gather_ranges(block(node), block_elems(node), dtype, cut);
    });
  }
}

}  // namespace xs::detail
