#pragma once
// The cut: the pending IR reachable from a set of roots, flattened into a topologically
// ordered list (operands first) with its data inputs deduplicated by buffer, and hashed.
// The hash covers structure, attributes, shapes, dtypes, input order and donation flags,
// never data values, so the same step traced again maps to the same compiled program.
//
//   Graph g = cut_graph(roots, /*allow_donation=*/true);
//   auto program = cache.find(g.hash);

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "xla_spawn/runtime/node.h"

namespace xs {

struct GNode {
  Op op;
  Attrs attrs;
  ValueType type;
  std::vector<int> operands;  // indices of earlier nodes
  int input = -1;             // kData: index into Graph::inputs
  RecordSite site;            // the recording node's site (not hashed)
};

struct Graph {
  std::vector<GNode> nodes;
  std::vector<int> roots;  // one node index per requested root, in request order
  std::vector<BufferPtr> inputs;
  // Per input: nothing outside this graph holds the buffer, nor any leaf node wrapping it
  // (autograd's saved values, IR a caller kept), so the program may overwrite it (an updated
  // parameter then reuses its old buffer).
  std::vector<uint8_t> donated;
  uint64_t hash = 0;
};

// Flattens the IR under `roots`. Donation is only sound when every pending use of the
// inputs is in this graph (mark_step), not for a partial sync. root_owners[k]: how many
// tensors hold roots[k] as their pending node (1 each when empty); a node with holders beyond
// those, the graph's own references and the `roots` span is held from outside, and no input
// under it is donated.
Graph cut_graph(std::span<const NodePtr> roots, bool allow_donation,
                std::span<const int> root_owners = {});
// Recomputes the hash of `graph` from its contents.
uint64_t hash_graph(const Graph& graph);

// Human-readable listing and Graphviz DOT, both headed by the graph hash; a node recorded with
// XLA_SPAWN_IR_DEBUG=1 shows its site ("@ examples/train_fmnist/trainer.cpp:80").
std::string graph_text(const Graph& graph);
std::string graph_dot(const Graph& graph);
// The attributes a node's op uses, as the listing shows them (" ints=[1] dtype=f64"); "" if none.
std::string attrs_text(const GNode& node);

}  // namespace xs
