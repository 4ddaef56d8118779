#pragma once
// The recompile explainer: a compact summary of each compiled graph, kept per hash beside the
// compile cache, and the comparison of a newly compiled graph with the closest kept one, which
// names the first difference in words a user can act on:
//
//   step 12 recompiled: input 0 shape [32, 784] -> [17, 784] (operand 0 of op 2 matmul,
//   recorded at examples/train.cpp:40); ...
//
//   GraphHistory history(64);
//   GraphSummary now = summarize(graph, step, /*step_graph=*/true, /*ir_debug=*/true);
//   if (const GraphSummary* old = history.closest(now)) log(explain_recompile(*old, now));
//   history.insert(std::move(now));

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "xla_spawn/runtime/graph.h"

namespace xs {

// What the explainer needs of a compiled graph: no buffers, just structure, types and sites.
struct GraphSummary {
  uint64_t hash = 0;
  int64_t step = 0;          // the MarkStep count when it was compiled
  bool step_graph = true;    // false: the graph of a host read (Runtime::sync)
  bool ir_debug = false;     // recorded with XLA_SPAWN_IR_DEBUG=1 (nodes carry sites)
  std::vector<GNode> nodes;  // as Graph::nodes; a kData node carries its input's type
  std::vector<int> roots;
  std::vector<uint8_t> donated;
};

GraphSummary summarize(const Graph& graph, int64_t step, bool step_graph, bool ir_debug);

// How many leading nodes `a` and `b` share (same op, attributes, type, operands and input).
size_t common_prefix(const GraphSummary& a, const GraphSummary& b);

// One line: the step, the first difference of `now` from `old` (an input's shape or dtype, a
// data scalar that became a constant, an op added, removed or changed, the step's outputs, a
// donation, or the same graph whose program was evicted) with the site that recorded it, and
// which graph it was compared with.
std::string explain_recompile(const GraphSummary& old, const GraphSummary& now);

// The summaries of the last `capacity` graphs compiled or run, least recently used evicted
// first. The runtime keeps twice the compile cache's capacity (and touches a summary on every
// cache hit), so it holds every cached program's summary and can tell a recompile caused by an
// eviction from one caused by a change.
class GraphHistory {
 public:
  explicit GraphHistory(size_t capacity) : capacity_(capacity) {}

  void insert(GraphSummary summary);
  void touch(uint64_t hash);
  // The closest summary to `now`, or null when there is none. Closest: `now`'s own (its program
  // was evicted), else of the same kind (a step's graph or a host read's), then the longest
  // common prefix (where the two traces diverge first is the difference that caused the rest),
  // then the most recently used (the step the user just ran, when several diverge at one node).
  const GraphSummary* closest(const GraphSummary& now) const;
  size_t size() const { return order_.size(); }

 private:
  size_t capacity_;
  std::list<GraphSummary> order_;  // most recently used first
  std::unordered_map<uint64_t, std::list<GraphSummary>::iterator> index_;
};

}  // namespace xs
