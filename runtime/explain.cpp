#include "xla_spawn/runtime/explain.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace xs {

GraphSummary summarize(const Graph& graph, int64_t step, bool step_graph, bool ir_debug) {
  return GraphSummary{graph.hash,  step,        step_graph,   ir_debug,
                      graph.nodes, graph.roots, graph.donated};
}

namespace {

bool same_node(const GNode& a, const GNode& b) {
  return a.op == b.op && a.attrs == b.attrs && a.type == b.type && a.operands == b.operands &&
         a.input == b.input;
}

// The numbering of graph_text's listing: "input 2" (data#2) or "op 5 mul" (%5).
std::string name_of(const GraphSummary& g, size_t i) {
  const GNode& n = g.nodes[i];
  if (n.op == Op::kData) return fmt::format("input {}", n.input);
  return fmt::format("op {} {}", i, op_name(n.op));
}

std::string recorded(const RecordSite& site) {
  return site.known() ? fmt::format("recorded at {}", site_text(site)) : "";
}

// " (recorded at x.cpp:40)", or "" when the site is not known.
std::string recorded_at(const RecordSite& site) {
  return site.known() ? fmt::format(" ({})", recorded(site)) : "";
}

// Where node i is first used, as " (operand 1 of op 5 mul, recorded at x.cpp:40)": a data
// input has no site of its own, its first user's line is where the user passed it in.
std::string first_use(const GraphSummary& g, size_t i) {
  for (size_t u = i + 1; u < g.nodes.size(); ++u) {
    const std::vector<int>& ops = g.nodes[u].operands;
    const auto it = std::find(ops.begin(), ops.end(), static_cast<int>(i));
    if (it == ops.end()) continue;
    const std::string site = recorded(g.nodes[u].site);
    return fmt::format(" (operand {} of {}{}{})", it - ops.begin(), name_of(g, u),
                       site.empty() ? "" : ", ", site);
  }
  return " (a result of the step)";
}

std::string type_change(const ValueType& a, const ValueType& b) {
  if (a.dtype == b.dtype)
    return fmt::format("shape {} -> {}", shape_str(a.shape), shape_str(b.shape));
  if (a.shape == b.shape)
    return fmt::format("dtype {} -> {}", dtype_name(a.dtype), dtype_name(b.dtype));
  return fmt::format("{} -> {}", type_str(a), type_str(b));
}

std::string attrs_change(const Attrs& a, const Attrs& b) {
  std::vector<std::string> parts;
  if (a.ints != b.ints)
    parts.push_back(
        fmt::format("ints [{}] -> [{}]", fmt::join(a.ints, ", "), fmt::join(b.ints, ", ")));
  if (a.scalar != b.scalar) parts.push_back(fmt::format("scalar {} -> {}", a.scalar, b.scalar));
  if (a.dtype != b.dtype)
    parts.push_back(fmt::format("dtype {} -> {}", dtype_name(a.dtype), dtype_name(b.dtype)));
  if (a.flag != b.flag) parts.push_back(fmt::format("flag {} -> {}", a.flag, b.flag));
  return fmt::format("{}", fmt::join(parts, ", "));
}

constexpr const char* kConstantHint =
    "; Tensor::scalar compiles 0 and 1 in as constants and passes any other value as data, so a "
    "value that can become 0 or 1 (a decayed rate) belongs in a tensor (Tensor::from_vector)";

// At node k a data input, a constant, or both; the types differ or one became the other.
std::string explain_leaf(const GraphSummary& old, const GraphSummary& now, size_t k) {
  const GNode& o = old.nodes[k];
  const GNode& n = now.nodes[k];
  if (o.op == Op::kData && n.op == Op::kData) {
    return fmt::format("input {} {}{}", n.input, type_change(o.type, n.type), first_use(now, k));
  }
  // A constant's own site is the line that made it (an operator's, Tensor::scalar's caller).
  const std::string where = n.site.known() ? recorded_at(n.site) : first_use(now, k);
  if (o.op == Op::kData) {
    return fmt::format("the data scalar input {} ({}) became the constant {} (op {}){}{}", o.input,
                       type_str(o.type), n.attrs.scalar, k, where, kConstantHint);
  }
  if (n.op == Op::kData) {
    return fmt::format("the constant {} (op {}) became the data scalar input {} ({}){}{}",
                       o.attrs.scalar, k, n.input, type_str(n.type), where, kConstantHint);
  }
  if (o.attrs.scalar != n.attrs.scalar) {
    return fmt::format("op {} constant: value {} -> {}{}{}", k, o.attrs.scalar, n.attrs.scalar,
                       where,
                       o.type == n.type ? "" : fmt::format(", {}", type_change(o.type, n.type)));
  }
  return fmt::format("op {} constant {}: {}{}", k, n.attrs.scalar, type_change(o.type, n.type),
                     where);
}

// At node k both graphs have the same op; its attributes, operands or type differ.
std::string explain_same_op(const GraphSummary& old, const GraphSummary& now, size_t k) {
  const GNode& o = old.nodes[k];
  const GNode& n = now.nodes[k];
  const std::string name = name_of(now, k);
  std::vector<std::string> parts;
  if (o.attrs != n.attrs) parts.push_back("attributes " + attrs_change(o.attrs, n.attrs));
  if (o.operands.size() != n.operands.size()) {
    parts.push_back(fmt::format("{} operands -> {}", o.operands.size(), n.operands.size()));
  } else {
    // Operands index nodes before k, which the two graphs share: one name fits both.
    for (size_t j = 0; j < n.operands.size(); ++j) {
      if (o.operands[j] == n.operands[j]) continue;
      parts.push_back(fmt::format("operand {} is {} (was {})", j, name_of(now, n.operands[j]),
                                  name_of(old, o.operands[j])));
      break;
    }
  }
  if (o.type != n.type) parts.push_back("result " + type_change(o.type, n.type));
  return fmt::format("{}: {}{}", name, fmt::join(parts, ", "), recorded_at(n.site));
}

std::string node_description(const GraphSummary& g, size_t i) {
  return g.nodes[i].op == Op::kData
             ? name_of(g, i) + " " + type_str(g.nodes[i].type) + first_use(g, i)
             : name_of(g, i) + recorded_at(g.nodes[i].site);
}

// At node k the ops differ, or one graph has ended: say what was added, removed or replaced.
std::string explain_other_op(const GraphSummary& old, const GraphSummary& now, size_t k) {
  const size_t on = old.nodes.size(), nn = now.nodes.size();
  const std::string sizes = fmt::format("the graph has {} nodes, the cached graph {}", nn, on);
  if (k == on) return fmt::format("new {} ({})", node_description(now, k), sizes);
  if (k == nn) return fmt::format("{} of the cached graph is gone ({})", node_description(old, k), sizes);
  // One node in, or out, and the rest lines up again: an insertion or a removal.
  const bool inserted = k + 1 < nn && now.nodes[k + 1].op == old.nodes[k].op;
  const bool removed = k + 1 < on && old.nodes[k + 1].op == now.nodes[k].op;
  if (inserted && !removed)
    return fmt::format("new {} before {}", node_description(now, k), name_of(old, k));
  if (removed && !inserted) return fmt::format("{} of the cached graph is gone", node_description(old, k));
  return fmt::format("{} where the cached graph has {}", node_description(now, k), node_description(old, k));
}

// The nodes are the same: the outputs or the donation flags differ.
std::string explain_same_nodes(const GraphSummary& old, const GraphSummary& now) {
  if (old.roots.size() != now.roots.size()) {
    return fmt::format(
        "the same ops, but {} results instead of {}: a tensor of the step is kept alive across "
        "mark_step now, or no longer is",
        now.roots.size(), old.roots.size());
  }
  for (size_t r = 0; r < now.roots.size(); ++r) {
    if (old.roots[r] == now.roots[r]) continue;
    return fmt::format("the same ops, but result {} is {} (was {})", r, name_of(now, now.roots[r]),
                       name_of(old, old.roots[r]));
  }
  for (size_t i = 0; i < now.nodes.size(); ++i) {
    const int in = now.nodes[i].input;
    if (in < 0 || old.donated[in] == now.donated[in]) continue;
    return fmt::format("input {} {}{} {}", in, type_str(now.nodes[i].type), first_use(now, i),
                       now.donated[in]
                           ? "is donated now (nothing outside the step holds its buffer any more)"
                           : "is no longer donated: a handle outside the step holds its buffer (a "
                             "copy of a tensor the step updates)");
  }
  return "no difference in nodes, results or donation flags";
}

// How many of `now`'s ops `old` has too, counted by kind whatever their order: a graph of the
// same computation with a changed shape, op or input keeps most; evaluation against a
// training step, or generation against either, keeps few.
size_t shared_ops(const GraphSummary& old, const GraphSummary& now) {
  std::vector<size_t> count(kNumOps, 0);
  for (const GNode& n : old.nodes) ++count[static_cast<size_t>(n.op)];
  size_t shared = 0;
  for (const GNode& n : now.nodes) {
    size_t& left = count[static_cast<size_t>(n.op)];
    if (left > 0) {
      --left;
      ++shared;
    }
  }
  return shared;
}

}  // namespace

size_t common_prefix(const GraphSummary& a, const GraphSummary& b) {
  const size_t n = std::min(a.nodes.size(), b.nodes.size());
  size_t k = 0;
  while (k < n && same_node(a.nodes[k], b.nodes[k])) ++k;
  return k;
}

std::string explain_recompile(const GraphSummary& old, const GraphSummary& now) {
  const size_t k = common_prefix(old, now);
  const size_t on = old.nodes.size(), nn = now.nodes.size();
  const auto leaf = [](const GNode& n) { return n.op == Op::kData || n.op == Op::kConst; };
  std::string what;
  if (old.hash == now.hash) {
    what =
        "the same graph was compiled before and its program evicted from the compile cache "
        "(more distinct graphs than XLA_SPAWN_COMPILE_CACHE_SIZE)";
  } else if (const size_t shared = shared_ops(old, now); 2 * shared < std::max(on, nn)) {
    what = fmt::format(
        "a different computation, not a changed step: it has {} ops and the closest cached "
        "graph {}, of which only {} are shared (evaluation, generation or another part of a "
        "program compiles a graph of its own, once)",
        nn, on, shared);
  } else if (k == on && k == nn) {
    what = explain_same_nodes(old, now);
  } else if (k < on && k < nn && leaf(old.nodes[k]) && leaf(now.nodes[k])) {
    what = explain_leaf(old, now, k);
  } else if (k < on && k < nn && old.nodes[k].op == now.nodes[k].op) {
    what = explain_same_op(old, now, k);
  } else {
    what = explain_other_op(old, now, k);
  }
  const std::string when = now.step_graph
                               ? fmt::format("step {} recompiled", now.step)
                               : fmt::format("a host read after step {} compiled", now.step);
  return fmt::format(
      "{}: {}; compared with graph {:016x} from step {}, which has the same first {} of {} nodes{}",
      when, what, old.hash, old.step, k, now.nodes.size(),
      now.ir_debug ? ""
                   : " (set XLA_SPAWN_IR_DEBUG=1 to see the source line that recorded each op)");
}

void GraphHistory::insert(GraphSummary summary) {
  if (capacity_ == 0) return;
  const uint64_t hash = summary.hash;
  if (auto it = index_.find(hash); it != index_.end()) {
    order_.erase(it->second);
    index_.erase(it);
  }
  order_.push_front(std::move(summary));
  index_.emplace(hash, order_.begin());
  while (order_.size() > capacity_) {
    index_.erase(order_.back().hash);
    order_.pop_back();
  }
}

void GraphHistory::touch(uint64_t hash) {
  if (auto it = index_.find(hash); it != index_.end())
    order_.splice(order_.begin(), order_, it->second);
}

const GraphSummary* GraphHistory::closest(const GraphSummary& now) const {
  const GraphSummary* best = nullptr;
  size_t best_prefix = 0;
  bool best_same_kind = false;
  for (const GraphSummary& g : order_) {  // most recent first: a later one must do strictly better
    if (g.hash == now.hash) return &g;    // compiled before: its program was evicted
    const bool same_kind = g.step_graph == now.step_graph;
    const size_t prefix = common_prefix(g, now);
    if (best != nullptr &&
        (best_same_kind > same_kind || (best_same_kind == same_kind && prefix <= best_prefix)))
      continue;
    best = &g;
    best_prefix = prefix;
    best_same_kind = same_kind;
  }
  return best;
}

}  // namespace xs
