#pragma once
// Reverse-mode autograd over the lazy IR. Ops recorded on tensors that require gradients (while
// gradients are enabled) remember their inputs; backward() walks that record from a scalar and
// records the gradient ops, from the per-op rules of runtime/ops.def, as more lazy IR: the
// forward, backward and the optimizer update then run as one graph at mark_step().
//
//   Tensor w = Tensor::full_data({3}, 0.5).set_requires_grad(true);
//   Tensor loss = sum(square(w * x));
//   backward(loss);                    // w.grad() is now pending IR
//   { NoGradGuard g; w.assign(w - w.grad() * 0.1); }

#include <memory>
#include <span>
#include <vector>

#include "xla_spawn/runtime/tensor.h"

namespace xs {

// What a gradient rule sees: the op, its attributes, its operands and its result (as tensors
// over the recorded IR, so the rule may reuse forward values).
struct GradContext {
  Op op;
  const Attrs& attrs;
  std::span<const Tensor> inputs;
  const Tensor& output;
};

// Returns one gradient per operand (undefined: none, e.g. an integer index). A gradient may have
// the result's broadcast shape; autograd sums it down to the operand's shape.
using GradRule = std::vector<Tensor> (*)(const GradContext& ctx, const Tensor& grad_out);

// The rule registered for `op` in ops.def, or nullptr.
GradRule grad_rule(Op op);

// One recorded differentiable op: the forward values it needs and where gradients go next.
struct AutogradNode {
  Op op;
  Attrs attrs;
  std::vector<NodePtr> inputs;  // IR, not tensors: saved values never become step outputs
  NodePtr output;
  // Per operand: the producing node (non-leaf), or the leaf tensor, or neither.
  std::vector<std::shared_ptr<AutogradNode>> next_nodes;
  std::vector<Tensor> next_leaves;
};

// Called by record(): attaches an AutogradNode to `result` when gradients are enabled, the
// result is floating point and some operand requires gradients.
void attach_grad_fn(Tensor& result, Op op, const Attrs& attrs, const std::vector<Tensor>& operands);

// Accumulates d(root)/d(leaf) into leaf.grad() for every leaf reachable from `root`. `root`
// must be a scalar unless `grad_root` (same shape) is given. Gradients are pending IR; the
// graph record is released (a second backward through it throws). With XLA_SPAWN_IR_DEBUG=1
// each gradient op's site is the line of the forward op it differentiates (runtime/site.h).
void backward(const Tensor& root, const Tensor& grad_root = {},
              SourceLoc loc = SourceLoc::current());

// Whether ops record autograd history (true unless a NoGradGuard is alive on this thread).
bool grad_enabled();

// Disables autograd recording for its scope (optimizer updates, evaluation).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// The same value without history: requires_grad false, no gradient flows through it.
Tensor detach(const Tensor& x);

// Sums `g` over the axes it was broadcast along so it has `shape` (the adjoint of broadcasting).
Tensor sum_to(const Tensor& g, const Shape& shape);

}  // namespace xs
