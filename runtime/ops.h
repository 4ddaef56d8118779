#pragma once
// The tensor operations: each records one IR node (checked by the op's shape rule at the call)
// and returns a pending tensor. Scalars mix in with the tensor's dtype (`x * 0.5`). Each op
// takes its caller's line last (defaulted; kept with XLA_SPAWN_IR_DEBUG=1, runtime/site.h).
//
//   Tensor h = relu(matmul(x, w) + b);
//   Tensor p = softmax(h, /*axis=*/1);
//   Tensor m = max_pool2d(conv2d(img, k, {1, 1}, {1, 1}), {2, 2}, {2, 2}, {0, 0});

#include <cstdint>
#include <vector>

#include "xla_spawn/runtime/tensor.h"

namespace xs {

// Records `op` on tensors with attributes (the generic entry point the wrappers use).
Tensor record(Op op, const std::vector<Tensor>& operands, Attrs attrs = {},
              SourceLoc loc = SourceLoc::current());

// Elementwise unary.
Tensor neg(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor abs(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor sign(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor square(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor relu(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor exp(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor log(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor sqrt(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor rsqrt(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor reciprocal(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor tanh(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor sigmoid(const Tensor& x, SourceLoc loc = SourceLoc::current());
// gelu: the exact (erf) form, as PyTorch's default.
Tensor gelu(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor erf(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor sin(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor cos(const Tensor& x, SourceLoc loc = SourceLoc::current());
Tensor logical_not(const Tensor& x, SourceLoc loc = SourceLoc::current());

// Elementwise binary with numpy broadcasting.
Tensor add(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor sub(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor mul(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor div(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor maximum(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor minimum(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor pow(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor eq(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor ne(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor lt(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor le(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor gt(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor ge(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor logical_and(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor logical_or(const Tensor& a, const Tensor& b, SourceLoc loc = SourceLoc::current());
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b,
             SourceLoc loc = SourceLoc::current());
Tensor cast(const Tensor& x, DType dtype, SourceLoc loc = SourceLoc::current());

// An operator's tensor operand with the caller's line. An overloaded operator cannot take a
// defaulted parameter, but the implicit conversion to this type is made at the caller's
// expression, so its defaulted `loc` is that line. Only one operand of each overload is an
// OperandAt: every overload stays one user-defined conversion away, as no other type converts
// to Tensor, so `a * b`, `a * 2.0` and `2.0 * a` resolve as before.
struct OperandAt {
  OperandAt(const Tensor& t, SourceLoc loc = SourceLoc::current()) : tensor(t), loc(loc) {}
  const Tensor& tensor;  // the caller's operand: lives to the end of the full expression
  SourceLoc loc;
};

Tensor operator+(OperandAt a, const Tensor& b);
Tensor operator-(OperandAt a, const Tensor& b);
Tensor operator*(OperandAt a, const Tensor& b);
Tensor operator/(OperandAt a, const Tensor& b);
Tensor operator-(OperandAt a);
Tensor operator+(OperandAt a, double b);
Tensor operator-(OperandAt a, double b);
Tensor operator*(OperandAt a, double b);
Tensor operator/(OperandAt a, double b);
Tensor operator+(double a, OperandAt b);
Tensor operator-(double a, OperandAt b);
Tensor operator*(double a, OperandAt b);
Tensor operator/(double a, OperandAt b);

// Reductions; negative axes count from the end; empty `axes` means all axes.
Tensor sum(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false,
           SourceLoc loc = SourceLoc::current());
Tensor mean(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false,
            SourceLoc loc = SourceLoc::current());
Tensor max(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false,
           SourceLoc loc = SourceLoc::current());
Tensor min(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false,
           SourceLoc loc = SourceLoc::current());
Tensor argmax(const Tensor& x, int64_t axis, bool keepdim = false,
              SourceLoc loc = SourceLoc::current());

// Layout. reshape accepts one -1.
Tensor reshape(const Tensor& x, std::vector<int64_t> shape, SourceLoc loc = SourceLoc::current());
Tensor permute(const Tensor& x, std::vector<int64_t> perm, SourceLoc loc = SourceLoc::current());
Tensor transpose(const Tensor& x, int64_t axis0, int64_t axis1,
                 SourceLoc loc = SourceLoc::current());
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step = 1,
             SourceLoc loc = SourceLoc::current());
Tensor concat(const std::vector<Tensor>& xs, int64_t axis, SourceLoc loc = SourceLoc::current());
Tensor broadcast_to(const Tensor& x, const Shape& shape, SourceLoc loc = SourceLoc::current());
// pads[2*i], pads[2*i+1]: elements before and after along axis i, filled with `value`.
Tensor pad(const Tensor& x, std::vector<int64_t> pads, double value = 0,
           SourceLoc loc = SourceLoc::current());

// a[..., m, k] x b[..., k, n] with broadcast batch dims; the flags transpose the last two
// dims of an operand without a copy.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false,
              SourceLoc loc = SourceLoc::current());
// NCHW input, OIHW weight; stride and padding as {h, w}.
Tensor conv2d(const Tensor& x, const Tensor& weight, std::vector<int64_t> stride = {1, 1},
              std::vector<int64_t> padding = {0, 0}, SourceLoc loc = SourceLoc::current());
Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding = {0, 0}, SourceLoc loc = SourceLoc::current());
// Averages include padding (count_include_pad, PyTorch's default).
Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding = {0, 0}, SourceLoc loc = SourceLoc::current());

// Gradients (adjoints) of conv2d, the poolings and gather, for autograd's rules.
// input_hw / kernel_hw: the spatial size {h, w} of the forward input / weight.
Tensor conv2d_grad_input(const Tensor& grad_out, const Tensor& weight, std::vector<int64_t> stride,
                         std::vector<int64_t> padding, std::vector<int64_t> input_hw,
                         SourceLoc loc = SourceLoc::current());
Tensor conv2d_grad_weight(const Tensor& x, const Tensor& grad_out, std::vector<int64_t> stride,
                          std::vector<int64_t> padding, std::vector<int64_t> kernel_hw,
                          SourceLoc loc = SourceLoc::current());
Tensor max_pool2d_grad(const Tensor& x, const Tensor& grad_out, std::vector<int64_t> kernel,
                       std::vector<int64_t> stride, std::vector<int64_t> padding = {0, 0},
                       SourceLoc loc = SourceLoc::current());
// max_pool2d_grad(relu(x + bias[c]), grad_out) without relu(x + bias) stored: the kernel
// recomputes it (the compiler's conv-bias-relu-pool fusion makes this form). bias: C elements.
Tensor max_pool2d_bias_relu_grad(const Tensor& x, const Tensor& bias, const Tensor& grad_out,
                                 std::vector<int64_t> kernel, std::vector<int64_t> stride,
                                 std::vector<int64_t> padding = {0, 0},
                                 SourceLoc loc = SourceLoc::current());
Tensor avg_pool2d_grad(const Tensor& grad_out, std::vector<int64_t> input_hw,
                       std::vector<int64_t> kernel, std::vector<int64_t> stride,
                       std::vector<int64_t> padding = {0, 0}, SourceLoc loc = SourceLoc::current());
// Zeros of `shape`, then result[... index[i] on axis ...] += src[i] (the adjoint of gather).
Tensor scatter_add(const Tensor& index, const Tensor& src, int64_t axis, const Shape& shape,
                   SourceLoc loc = SourceLoc::current());

// out[i][j] = x[index[i][j]][j] (axis 0), like torch.gather; index is i32/i64.
Tensor gather(const Tensor& x, int64_t axis, const Tensor& index,
              SourceLoc loc = SourceLoc::current());
Tensor one_hot(const Tensor& index, int64_t num_classes, DType dtype = DType::kF32,
               SourceLoc loc = SourceLoc::current());
// table [V, D], index (i32/i64) of any shape -> [index shape..., D]: row index[i] of the table.
Tensor embedding(const Tensor& table, const Tensor& index, SourceLoc loc = SourceLoc::current());
// The adjoint of embedding: a [rows, D] table of zeros with each grad row added at its index.
Tensor embedding_grad(const Tensor& index, const Tensor& grad, int64_t rows,
                      SourceLoc loc = SourceLoc::current());

// Normalises x over its last axis: (x - mean) / sqrt(var + eps) * gamma + beta, with the
// biased variance as PyTorch's LayerNorm; gamma and beta have x's last dimension.
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-5,
                  SourceLoc loc = SourceLoc::current());
// Its gradients (for autograd's rule): of x, or of gamma (sum over rows of grad_y * xhat).
Tensor layer_norm_grad_input(const Tensor& x, const Tensor& gamma, const Tensor& grad_y, double eps,
                             SourceLoc loc = SourceLoc::current());
Tensor layer_norm_grad_gamma(const Tensor& x, const Tensor& gamma, const Tensor& grad_y, double eps,
                             SourceLoc loc = SourceLoc::current());

// In-graph RNG. Without a seed, the runtime's seed stream supplies a fresh one (a data
// input: no recompile). bernoulli's p is a data scalar too.
Tensor rand_uniform(const Shape& shape, DType dtype = DType::kF32, Tensor seed = {},
                    SourceLoc loc = SourceLoc::current());
Tensor rand_normal(const Shape& shape, DType dtype = DType::kF32, Tensor seed = {},
                   SourceLoc loc = SourceLoc::current());
Tensor bernoulli(const Shape& shape, double p, DType dtype = DType::kF32, Tensor seed = {},
                 SourceLoc loc = SourceLoc::current());

// Reduces across replicas through the runtime's Communicator; identity without one.
Tensor all_reduce(const Tensor& x, ReduceOp op, SourceLoc loc = SourceLoc::current());

// Composites.
Tensor logsumexp(const Tensor& x, int64_t axis, bool keepdim = false,
                 SourceLoc loc = SourceLoc::current());
// Over the last axis it is one op (stable: shifted by the row max), elsewhere a composite.
Tensor softmax(const Tensor& x, int64_t axis, SourceLoc loc = SourceLoc::current());
// Softmax over the last axis of scores [..., T, T] where row t sees only columns 0..t (the
// causal attention mask, without a mask tensor); masked entries are 0.
Tensor causal_softmax(const Tensor& scores, SourceLoc loc = SourceLoc::current());
// The gradient of softmax / causal_softmax from its result y (for autograd's rule).
Tensor softmax_grad(const Tensor& y, const Tensor& grad_y, bool causal,
                    SourceLoc loc = SourceLoc::current());
Tensor log_softmax(const Tensor& x, int64_t axis, SourceLoc loc = SourceLoc::current());

}  // namespace xs
