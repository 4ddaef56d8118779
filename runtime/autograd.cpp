#include "xla_spawn/runtime/autograd.h"

#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autocast.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

namespace {

// Per thread, like PyTorch's grad mode (the runtime itself is one per replica process).
thread_local bool g_grad_enabled = true;

bool has_history(const Tensor& t) {
  return t.defined() && (t.impl()->grad_fn != nullptr || t.requires_grad());
}

// Nodes reachable from `root`, each after every node that feeds gradients into it (so
// processing in this order sees a node's full gradient before its rule runs).
std::vector<AutogradNode*> topological_order(AutogradNode* root) {
  std::vector<AutogradNode*> post;
  std::unordered_map<AutogradNode*, bool> seen;
  std::vector<std::pair<AutogradNode*, size_t>> stack{{root, 0}};
  seen[root] = true;
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->next_nodes.size()) {
      AutogradNode* child = node->next_nodes[next++].get();
      if (child != nullptr && !seen[child]) {
        seen[child] = true;
        stack.push_back({child, 0});
      }
      continue;
    }
    post.push_back(node);
    stack.pop_back();
  }
  std::reverse(post.begin(), post.end());
  return post;
}

Tensor accumulate(const Tensor& sum_so_far, const Tensor& g) {
  return sum_so_far.defined() ? sum_so_far + g : g;
}

std::vector<Tensor> run_rule(AutogradNode& node, const Tensor& grad_out) {
  const GradRule rule = grad_rule(node.op);
  if (rule == nullptr) {
    throw InvalidArgument(
        fmt::format("backward: op '{}' has no gradient rule (in runtime/ops.def) but a gradient "
                    "flows through it; detach() its result or add a rule",
                    op_name(node.op)));
  }
  if (node.output == nullptr) {
    throw InvalidArgument(
        fmt::format("backward: through the record of '{}' a second time; its saved values were "
                    "released by the first backward()",
                    op_name(node.op)));
  }
  std::vector<Tensor> inputs;
  inputs.reserve(node.inputs.size());
  for (const NodePtr& n : node.inputs) inputs.push_back(Tensor::from_ir(n));
  const Tensor output = Tensor::from_ir(node.output);
  std::vector<Tensor> grads = rule(GradContext{node.op, node.attrs, inputs, output}, grad_out);
  XS_CHECK_EQ(grads.size(), inputs.size(), "gradient rule of {}", op_name(node.op));
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    grads[i] = sum_to(grads[i], inputs[i].shape());
    if (grads[i].dtype() != inputs[i].dtype()) grads[i] = cast(grads[i], inputs[i].dtype());
  }
  return grads;
}

void accumulate_into_leaf(Tensor leaf, const Tensor& g) {
  const Tensor old = leaf.grad();
  // A fresh handle: the leaf's gradient must not alias a tensor the caller or another path holds.
  leaf.set_grad(old.defined() ? old + g : Tensor::from_ir(g.ir()));
}

}  // namespace

void attach_grad_fn(Tensor& result, Op op, const Attrs& attrs,
                    const std::vector<Tensor>& operands) {
  if (!g_grad_enabled || !is_float(result.dtype())) return;
  if (std::none_of(operands.begin(), operands.end(), has_history)) return;
  auto node = std::make_shared<AutogradNode>();
  node->op = op;
  node->attrs = attrs;
  node->output = result.ir();
  for (const Tensor& t : operands) {
    node->inputs.push_back(t.ir());
    const bool leaf = t.impl()->grad_fn == nullptr && t.requires_grad();
    node->next_nodes.push_back(t.impl()->grad_fn);
    node->next_leaves.push_back(leaf ? t : Tensor());
  }
  result.impl()->grad_fn = std::move(node);
  result.impl()->requires_grad = true;
}

void backward(const Tensor& root, const Tensor& grad_root, SourceLoc loc) {
  detail::SiteScope scope(loc);  // the seed and the leaf sums: the backward() call's line
  if (!root.defined() || !root.requires_grad()) {
    throw InvalidArgument(
        "backward: the tensor does not require gradients (no input of it requires them, or it "
        "was computed under no_grad)");
  }
  if (!grad_root.defined() && root.numel() != 1) {
    throw InvalidArgument(fmt::format("backward: needs a scalar (got {}) or an explicit gradient",
                                      type_str(root.type())));
  }
  if (grad_root.defined() && grad_root.shape() != root.shape()) {
    throw InvalidArgument(fmt::format("backward: gradient {} does not match the tensor {}",
                                      type_str(grad_root.type()), type_str(root.type())));
  }
  NoGradGuard no_grad;
  AutocastGuard no_autocast(DType::kF32);  // gradients keep the dtypes the forward chose
  const Tensor seed = grad_root.defined() ? grad_root : Tensor::ones(root.shape(), root.dtype());
  if (root.is_leaf()) return accumulate_into_leaf(root, seed);
  std::shared_ptr<AutogradNode> keep = root.impl()->grad_fn;
  std::unordered_map<AutogradNode*, Tensor> pending{{keep.get(), seed}};
  for (AutogradNode* node : topological_order(keep.get())) {
    auto it = pending.find(node);
    if (it == pending.end())
      continue;  // no gradient reached it (e.g. only through integer operands)
    const Tensor grad_out = std::move(it->second);
    pending.erase(it);
    // The rule's ops, and the sums its gradients join, belong to this forward op's line: the
    // line a user can act on, not one inside grad_rules.cpp. When the forward op has no site
    // (it was recorded outside any op call), backward()'s line stays.
    const RecordSite forward{node->output != nullptr ? node->output->site.loc : SourceLoc(), true};
    detail::SiteScope at_forward(
        forward, forward.known() ? detail::SiteScope::kOverride : detail::SiteScope::kOutermost);
    const std::vector<Tensor> grads = run_rule(*node, grad_out);
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      if (AutogradNode* next = node->next_nodes[i].get())
        pending[next] = accumulate(pending[next], grads[i]);
      else if (node->next_leaves[i].defined())
        accumulate_into_leaf(node->next_leaves[i], grads[i]);
    }
    // Release saved values now (as PyTorch does without retain_graph).
    node->inputs.clear();
    node->output = nullptr;
  }
}

bool grad_enabled() {
  return g_grad_enabled;
}

NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) {
  g_grad_enabled = false;
}
NoGradGuard::~NoGradGuard() {
  g_grad_enabled = previous_;
}

Tensor detach(const Tensor& x) {
  return Tensor::from_ir(x.ir());
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int64_t extra = g.dim() - static_cast<int64_t>(shape.size());
  if (extra < 0) {
    throw InvalidArgument(
        fmt::format("sum_to: cannot reduce {} to shape {}", type_str(g.type()), shape_str(shape)));
  }
  std::vector<int64_t> axes;
  for (int64_t i = 0; i < g.dim(); ++i) {
    if (i < extra || (shape[i - extra] == 1 && g.shape()[i] != 1)) axes.push_back(i);
  }
  const Tensor reduced = axes.empty() ? g : sum(g, axes);
  return reshape(reduced, shape);
}

}  // namespace xs
