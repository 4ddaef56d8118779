#include "xla_spawn/runtime/graph.h"

#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "xla_spawn/runtime/hash.h"

namespace xs {
namespace {

struct Cutter {
  Graph graph;
  std::unordered_map<const Node*, int> index_of;
  std::unordered_map<const Buffer*, int> input_of;       // buffer -> its kData node index
  std::unordered_map<const Buffer*, int> leaf_nodes_of;  // distinct leaf nodes per buffer
  // Per node: its holders (use count) and how many of them this graph accounts for (its
  // nodes' operand lists; for a root, the caller's references). A node held from outside
  // (autograd's saved values, IR a caller kept) may be computed again after the step, from
  // the leaves under it: those buffers must not be overwritten.
  struct Refs {
    long holders = 0;
    long in_graph = 0;
  };
  std::unordered_map<const Node*, Refs> refs;

  int add_leaf(const Node* n) {
    ++leaf_nodes_of[n->data.get()];
    auto it = input_of.find(n->data.get());
    if (it != input_of.end()) return it->second;
    GNode g{Op::kData, {}, n->type, {}, static_cast<int>(graph.inputs.size()), n->site};
    graph.inputs.push_back(n->data);
    graph.nodes.push_back(std::move(g));
    const int idx = static_cast<int>(graph.nodes.size()) - 1;
    input_of.emplace(n->data.get(), idx);
    return idx;
  }

  // Iterative post-order DFS: deep chains (thousands of nodes) must not overflow the stack.
  int visit(const Node* root) {
    if (auto it = index_of.find(root); it != index_of.end()) return it->second;
    std::vector<std::pair<const Node*, size_t>> stack{{root, 0}};
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      if (next < n->operands.size()) {
        const Node* child = n->operands[next++].get();
        if (!index_of.count(child)) stack.push_back({child, 0});
        continue;
      }
      int idx;
      if (n->op == Op::kData) {
        idx = add_leaf(n);
      } else {
        GNode g{n->op, n->attrs, n->type, {}, -1, n->site};
        for (const NodePtr& o : n->operands) {
          g.operands.push_back(index_of.at(o.get()));
          Refs& r = refs[o.get()];
          r.holders = o.use_count();
          ++r.in_graph;
        }
        graph.nodes.push_back(std::move(g));
        idx = static_cast<int>(graph.nodes.size()) - 1;
      }
      index_of.emplace(n, idx);
      stack.pop_back();
    }
    return index_of.at(root);
  }
};

}  // namespace

Graph cut_graph(std::span<const NodePtr> roots, bool allow_donation,
                std::span<const int> root_owners) {
  Cutter c;
  for (const NodePtr& r : roots) c.graph.roots.push_back(c.visit(r.get()));
  c.graph.donated.assign(c.graph.inputs.size(), 0);
  if (!allow_donation) {
    c.graph.hash = hash_graph(c.graph);
    return std::move(c.graph);
  }
  for (size_t k = 0; k < roots.size(); ++k) {
    Cutter::Refs& r = c.refs[roots[k].get()];
    r.holders = roots[k].use_count();
    r.in_graph += 1 + (k < root_owners.size() ? root_owners[k] : 1);  // `roots` and its owners
  }
  // Inputs under a node held from outside stay as they are.
  std::vector<uint8_t> kept(c.graph.nodes.size(), 0);
  std::vector<int> stack;
  for (const auto& [node, r] : c.refs) {
    if (r.holders > r.in_graph) stack.push_back(c.index_of.at(node));
  }
  while (!stack.empty()) {
    const int i = stack.back();
    stack.pop_back();
    if (kept[static_cast<size_t>(i)]) continue;
    kept[static_cast<size_t>(i)] = 1;
    for (int o : c.graph.nodes[static_cast<size_t>(i)].operands) stack.push_back(o);
  }
  std::vector<uint8_t> input_kept(c.graph.inputs.size(), 0);
  for (size_t i = 0; i < kept.size(); ++i) {
    const GNode& g = c.graph.nodes[i];
    if (kept[i] && g.op == Op::kData) input_kept[static_cast<size_t>(g.input)] = 1;
  }
  for (size_t i = 0; i < c.graph.inputs.size(); ++i) {
    // Holders: each distinct leaf node, plus graph.inputs itself. Anything more is a live
    // tensor (or user code) still reading the buffer.
    const BufferPtr& b = c.graph.inputs[i];
    c.graph.donated[i] = b.use_count() == 1 + c.leaf_nodes_of.at(b.get()) && !input_kept[i];
  }
  c.graph.hash = hash_graph(c.graph);
  return std::move(c.graph);
}

uint64_t hash_graph(const Graph& graph) {
  uint64_t h = hash_combine(kHashSeed, graph.nodes.size());
  for (const GNode& n : graph.nodes) {
    h = hash_combine(h, static_cast<uint64_t>(n.op));
    h = hash_type(hash_attrs(h, n.attrs), n.type);
    h = hash_combine(h, static_cast<uint64_t>(n.input + 1));
    for (int o : n.operands) h = hash_combine(h, static_cast<uint64_t>(o));
  }
  for (int r : graph.roots) h = hash_combine(h, static_cast<uint64_t>(r) + 0x100000000ull);
  for (uint8_t d : graph.donated) h = hash_combine(h, d);
  return h;
}

std::string attrs_text(const GNode& n) {
  std::string s;
  if (!n.attrs.ints.empty()) s += fmt::format(" ints=[{}]", fmt::join(n.attrs.ints, ","));
  if (n.op == Op::kConst) s += fmt::format(" value={}", n.attrs.scalar);
  if (n.op == Op::kCast || n.op == Op::kOneHot || op_info(n.op).kind == OpKind::kRandom)
    s += fmt::format(" dtype={}", dtype_name(n.attrs.dtype));
  if (n.attrs.flag != 0) s += fmt::format(" flag={}", n.attrs.flag);
  return s;
}

std::string graph_text(const Graph& graph) {
  std::string out = fmt::format("graph hash={:016x} nodes={} inputs={}\n", graph.hash,
                                graph.nodes.size(), graph.inputs.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const GNode& n = graph.nodes[i];
    out += fmt::format("  %{} = {}{}({}){}{}{}\n", i, op_name(n.op),
                       n.input >= 0 ? fmt::format("#{}", n.input) : "", fmt::join(n.operands, ", "),
                       attrs_text(n), " : " + type_str(n.type),
                       n.site.known() ? "  @ " + site_text(n.site) : "");
  }
  out += fmt::format("  roots: [{}]\n", fmt::join(graph.roots, ", "));
  return out;
}

std::string graph_dot(const Graph& graph) {
  std::string out = fmt::format("digraph \"{:016x}\" {{\n  label=\"graph {:016x}\";\n",
                                graph.hash, graph.hash);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const GNode& n = graph.nodes[i];
    out += fmt::format("  n{} [label=\"%{} {}{}\\n{}{}\"{}];\n", i, i, op_name(n.op), attrs_text(n),
                       type_str(n.type), n.site.known() ? "\\n@ " + site_text(n.site) : "",
                       n.op == Op::kData ? " shape=box" : "");
    for (int o : n.operands) out += fmt::format("  n{} -> n{};\n", o, i);
  }
  for (int r : graph.roots) out += fmt::format("  n{} [peripheries=2];\n", r);
  return out + "}\n";
}

}  // namespace xs
