// Hierarchical all-gather: a local all-gather into the node's block of the output, each
// node's block broadcast piece by piece from that node, local gathers of the other blocks.
#include <cstring>

#include "collectives/detail/hierarchy.h"

namespace xs::detail {

// Hierarchical all-gather schedule. Node h's block of `out` holds the inputs of its ordinals
// first(h) .. first(h) + L_h - 1; its replicas fill it with a local all-gather. Then, node by
// node, each block is cut into pieces like any buffer of L_h * n_elems elements and every
// piece broadcast over its group from the block's node, so on every other node each replica
// holds its range of the block. Last, each node gathers the other nodes' blocks locally,
// block by block. (All network phases first, back to back, then the local ones.)
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
  for (int node = 0; node < t.nnodes(); ++node) {
    for (const CutPiece& p : h.my_pieces(block_elems(node), elem_bytes)) {
      h.groups.broadcast(p.holders, block(node) + p.offset * elem_bytes, p.count * elem_bytes,
                         node);
    }
  }
  for (int node = 0; node < t.nnodes(); ++node) {
    if (node == t.node()) continue;
    const std::vector<size_t> cut = h.my_cut(block_elems(node), elem_bytes);
    h.locally([&](ShmCommunicator& local) {
      local.gather_ranges(block(node), block_elems(node), dtype, cut);
    });
  }
}

}  // namespace xs::detail
