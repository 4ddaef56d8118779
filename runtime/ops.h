#pragma once
// The tensor operations: each records one IR node (checked by the op's shape rule at the call)
// and returns a pending tensor. Scalars mix in with the tensor's dtype (`x * 0.5`).
//
//   Tensor h = relu(matmul(x, w) + b);
//   Tensor p = softmax(h, /*axis=*/1);
//   Tensor m = max_pool2d(conv2d(img, k, {1, 1}, {1, 1}), {2, 2}, {2, 2}, {0, 0});

#include <cstdint>
#include <vector>

#include "xla_spawn/runtime/tensor.h"

namespace xs {

// Records `op` on tensors with attributes (the generic entry point the wrappers use).
Tensor record(Op op, const std::vector<Tensor>& operands, Attrs attrs = {});

// Elementwise unary.
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor square(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor gelu(const Tensor& x);  // exact (erf) form, as PyTorch's default
Tensor erf(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor logical_not(const Tensor& x);

// Elementwise binary with numpy broadcasting.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor cast(const Tensor& x, DType dtype);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

// Reductions; negative axes count from the end; empty `axes` means all axes.
Tensor sum(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor max(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor min(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t axis, bool keepdim = false);

// Layout. reshape accepts one -1.
Tensor reshape(const Tensor& x, std::vector<int64_t> shape);
Tensor permute(const Tensor& x, std::vector<int64_t> perm);
Tensor transpose(const Tensor& x, int64_t axis0, int64_t axis1);
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step = 1);
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);
Tensor broadcast_to(const Tensor& x, const Shape& shape);
// pads[2*i], pads[2*i+1]: elements before and after along axis i, filled with `value`.
Tensor pad(const Tensor& x, std::vector<int64_t> pads, double value = 0);

// a[..., m, k] x b[..., k, n] with broadcast batch dims; the flags transpose the last two
// dims of an operand without a copy.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
// NCHW input, OIHW weight; stride and padding as {h, w}.
Tensor conv2d(const Tensor& x, const Tensor& weight, std::vector<int64_t> stride = {1, 1},
              std::vector<int64_t> padding = {0, 0});
Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding = {0, 0});
// Averages include padding (count_include_pad, PyTorch's default).
Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding = {0, 0});

// Gradients (adjoints) of conv2d, the poolings and gather, for autograd's rules.
// input_hw / kernel_hw: the spatial size {h, w} of the forward input / weight.
Tensor conv2d_grad_input(const Tensor& grad_out, const Tensor& weight, std::vector<int64_t> stride,
                         std::vector<int64_t> padding, std::vector<int64_t> input_hw);
Tensor conv2d_grad_weight(const Tensor& x, const Tensor& grad_out, std::vector<int64_t> stride,
                          std::vector<int64_t> padding, std::vector<int64_t> kernel_hw);
Tensor max_pool2d_grad(const Tensor& x, const Tensor& grad_out, std::vector<int64_t> kernel,
                       std::vector<int64_t> stride, std::vector<int64_t> padding = {0, 0});
// max_pool2d_grad(relu(x + bias[c]), grad_out) without relu(x + bias) stored: the kernel
// recomputes it (the compiler's conv-bias-relu-pool fusion makes this form). bias: C elements.
Tensor max_pool2d_bias_relu_grad(const Tensor& x, const Tensor& bias, const Tensor& grad_out,
                                 std::vector<int64_t> kernel, std::vector<int64_t> stride,
                                 std::vector<int64_t> padding = {0, 0});
Tensor avg_pool2d_grad(const Tensor& grad_out, std::vector<int64_t> input_hw, std::vector<int64_t> kernel,
                       std::vector<int64_t> stride, std::vector<int64_t> padding = {0, 0});
// Zeros of `shape`, then result[... index[i] on axis ...] += src[i] (the adjoint of gather).
Tensor scatter_add(const Tensor& index, const Tensor& src, int64_t axis, const Shape& shape);

// out[i][j] = x[index[i][j]][j] (axis 0), like torch.gather; index is i32/i64.
Tensor gather(const Tensor& x, int64_t axis, const Tensor& index);
Tensor one_hot(const Tensor& index, int64_t num_classes, DType dtype = DType::kF32);
// table [V, D], index (i32/i64) of any shape -> [index shape..., D]: row index[i] of the table.
Tensor embedding(const Tensor& table, const Tensor& index);
// The adjoint of embedding: a [rows, D] table of zeros with each grad row added at its index.
Tensor embedding_grad(const Tensor& index, const Tensor& grad, int64_t rows);

// Normalises x over its last axis: (x - mean) / sqrt(var + eps) * gamma + beta, with the
// biased variance as PyTorch's LayerNorm; gamma and beta have x's last dimension.
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-5);
// Its gradients (for autograd's rule): of x, or of gamma (sum over rows of grad_y * xhat).
Tensor layer_norm_grad_input(const Tensor& x, const Tensor& gamma, const Tensor& grad_y, double eps);
Tensor layer_norm_grad_gamma(const Tensor& x, const Tensor& gamma, const Tensor& grad_y, double eps);

// In-graph RNG. Without a seed, the runtime's seed stream supplies a fresh one (a data
// input: no recompile). bernoulli's p is a data scalar too.
Tensor rand_uniform(const Shape& shape, DType dtype = DType::kF32, Tensor seed = {});
Tensor rand_normal(const Shape& shape, DType dtype = DType::kF32, Tensor seed = {});
Tensor bernoulli(const Shape& shape, double p, DType dtype = DType::kF32, Tensor seed = {});

// Reduces across replicas through the runtime's Communicator; identity without one.
Tensor all_reduce(const Tensor& x, ReduceOp op);

// Composites.
Tensor logsumexp(const Tensor& x, int64_t axis, bool keepdim = false);
// Over the last axis it is one op (stable: shifted by the row max), elsewhere a composite.
Tensor softmax(const Tensor& x, int64_t axis);
// Softmax over the last axis of scores [..., T, T] where row t sees only columns 0..t (the
// causal attention mask, without a mask tensor); masked entries are 0.
Tensor causal_softmax(const Tensor& scores);
// The gradient of softmax / causal_softmax from its result y (for autograd's rule).
Tensor softmax_grad(const Tensor& y, const Tensor& grad_y, bool causal);
Tensor log_softmax(const Tensor& x, int64_t axis);

}  // namespace xs
