// Hierarchical broadcast: locally on the root's node, over the network piece by piece from
// that node, then locally on the other nodes.
#include "xla_spawn/collectives/detail/hierarchy.h"

namespace xs::detail {

// Hierarchical broadcast schedule. The root's node broadcasts locally from the root, so each
// of its replicas holds every piece of its range. Every piece is broadcast over its group from
// the root's node (gloo rank = node); on each other node a replica then holds its range, and
// the local gather hands the ranges to the node's other replicas.
void multi_host_broadcast(const Hierarchy& h, std::byte* data, size_t n_elems, DType dtype,
                          int root) {
  const NodeTopology& t = h.topology;
  const int root_node = t.node_of(root);
  const size_t elem_bytes = dtype_size(dtype);
  if (t.node() == root_node) {
    h.locally([&](ShmCommunicator& local) {
      local.broadcast(data, n_elems, dtype, root - t.first_ordinal(root_node));
    });
  }
  for (const CutPiece& p : h.my_pieces(n_elems, elem_bytes)) {
    h.groups.broadcast(p.holders, data + p.offset * elem_bytes, p.count * elem_bytes, root_node);
  }
  if (t.node() != root_node) {
    const std::vector<size_t> cut = h.my_cut(n_elems, elem_bytes);
    h.locally([&](ShmCommunicator& local) { local.gather_ranges(data, n_elems, dtype, cut); });
  }
}

}  // namespace xs::detail
