// The per-op gradient rules named in runtime/ops.def: each maps the gradient of an op's result
// to gradients of its operands (in the result's broadcast shape; autograd sums them down).
// Checked against finite differences by tests/runtime/gradcheck_test.cpp.
#include <cmath>
#include <numbers>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {
namespace {

using Grads = std::vector<Tensor>;
using Ctx = GradContext;

const Tensor& in(const Ctx& c, size_t i) {
  return c.inputs[i];
}
Tensor mask(const Tensor& cond, DType dtype) {
  return cast(cond, dtype);
}
Tensor zero_of(const Tensor& x) {
  return Tensor::scalar(0, x.dtype());
}

Grads grad_neg(const Ctx&, const Tensor& g) {
  return {-g};
}
Grads grad_abs(const Ctx& c, const Tensor& g) {
  return {g * sign(in(c, 0))};
}
Grads grad_zero(const Ctx& c, const Tensor&) {
  return {Tensor::zeros(in(c, 0).shape(), in(c, 0).dtype())};
}
Grads grad_square(const Ctx& c, const Tensor& g) {
  return {g * in(c, 0) * 2.0};
}
// From the output (relu(x) > 0 iff x > 0): the pre-activation then need not be kept.
Grads grad_relu(const Ctx& c, const Tensor& g) {
  return {g * mask(gt(c.output, zero_of(g)), g.dtype())};
}
Grads grad_exp(const Ctx& c, const Tensor& g) {
  return {g * c.output};
}
Grads grad_log(const Ctx& c, const Tensor& g) {
  return {g / in(c, 0)};
}
Grads grad_sqrt(const Ctx& c, const Tensor& g) {
  return {g * 0.5 / c.output};
}
Grads grad_rsqrt(const Ctx& c, const Tensor& g) {
  return {g * -0.5 * c.output / in(c, 0)};
}
Grads grad_reciprocal(const Ctx& c, const Tensor& g) {
  return {-g * square(c.output)};
}
Grads grad_tanh(const Ctx& c, const Tensor& g) {
  return {g * (1.0 - square(c.output))};
}
Grads grad_sigmoid(const Ctx& c, const Tensor& g) {
  return {g * c.output * (1.0 - c.output)};
}
Grads grad_sin(const Ctx& c, const Tensor& g) {
  return {g * cos(in(c, 0))};
}
Grads grad_cos(const Ctx& c, const Tensor& g) {
  return {-g * sin(in(c, 0))};
}

Grads grad_erf(const Ctx& c, const Tensor& g) {
  const Tensor& x = in(c, 0);
  return {g * exp(-square(x)) * (2.0 / std::sqrt(std::numbers::pi))};
}

// d/dx x*Phi(x) = Phi(x) + x*phi(x), Phi the normal CDF (PyTorch's exact GELU).
Grads grad_gelu(const Ctx& c, const Tensor& g) {
  const Tensor& x = in(c, 0);
  const Tensor cdf = (erf(x * std::numbers::sqrt2 / 2) + 1.0) * 0.5;
  const Tensor pdf = exp(square(x) * -0.5) * (1 / std::sqrt(2 * std::numbers::pi));
  return {g * (cdf + x * pdf)};
}

Grads grad_add(const Ctx&, const Tensor& g) {
  return {g, g};
}
Grads grad_sub(const Ctx&, const Tensor& g) {
  return {g, -g};
}
Grads grad_mul(const Ctx& c, const Tensor& g) {
  return {g * in(c, 1), g * in(c, 0)};
}
Grads grad_div(const Ctx& c, const Tensor& g) {
  return {g / in(c, 1), -g * c.output / in(c, 1)};
}

// Ties send the whole gradient to the first operand.
Grads grad_maximum(const Ctx& c, const Tensor& g) {
  const Tensor first = mask(ge(in(c, 0), in(c, 1)), g.dtype());
  return {g * first, g * (1.0 - first)};
}

Grads grad_minimum(const Ctx& c, const Tensor& g) {
  const Tensor first = mask(le(in(c, 0), in(c, 1)), g.dtype());
  return {g * first, g * (1.0 - first)};
}

Grads grad_pow(const Ctx& c, const Tensor& g) {
  const Tensor &a = in(c, 0), &b = in(c, 1);
  return {g * b * pow(a, b - 1.0), g * c.output * log(a)};
}

Grads grad_where(const Ctx& c, const Tensor& g) {
  const Tensor z = zero_of(g);
  return {Tensor(), where(in(c, 0), g, z), where(in(c, 0), z, g)};
}

Grads grad_cast(const Ctx& c, const Tensor& g) {
  if (!is_float(in(c, 0).dtype())) return {Tensor()};
  return {cast(g, in(c, 0).dtype())};
}

// g with the reduced axes of a reduction over `x` put back (size 1), then broadcast to x.
Tensor unreduce(const Tensor& g, const Tensor& x, const Attrs& attrs) {
  Shape kept = x.shape();
  for (int64_t axis : attrs.ints) kept[axis] = 1;
  return broadcast_to(reshape(g, kept), x.shape());
}

int64_t reduced_count(const Tensor& x, const Attrs& attrs) {
  int64_t n = 1;
  for (int64_t axis : attrs.ints) n *= x.shape()[axis];
  return n;
}

Grads grad_sum(const Ctx& c, const Tensor& g) {
  return {unreduce(g, in(c, 0), c.attrs)};
}

Grads grad_mean(const Ctx& c, const Tensor& g) {
  return {unreduce(g, in(c, 0), c.attrs) / static_cast<double>(reduced_count(in(c, 0), c.attrs))};
}

// Shared equally among the elements that attain the extreme.
Grads grad_max_min(const Ctx& c, const Tensor& g) {
  const Tensor& x = in(c, 0);
  const Tensor hit = mask(eq(x, unreduce(c.output, x, c.attrs)), x.dtype());
  const Tensor ties = unreduce(sum(hit, c.attrs.ints, c.attrs.flag != 0), x, c.attrs);
  return {unreduce(g, x, c.attrs) * hit / ties};
}

Grads grad_reshape(const Ctx& c, const Tensor& g) {
  return {reshape(g, in(c, 0).shape())};
}

Grads grad_permute(const Ctx& c, const Tensor& g) {
  std::vector<int64_t> inverse(c.attrs.ints.size());
  for (size_t i = 0; i < inverse.size(); ++i) inverse[c.attrs.ints[i]] = static_cast<int64_t>(i);
  return {permute(g, inverse)};
}

// Per axis: interleave step-1 zeros after each element, then pad to the input's extent.
Grads grad_slice(const Ctx& c, const Tensor& g) {
  const Shape& shape = in(c, 0).shape();
  Tensor r = g;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    const int64_t start = c.attrs.ints[3 * d], step = c.attrs.ints[3 * d + 2], n = r.shape()[d];
    if (step > 1) {
      Shape split = r.shape();
      split.insert(split.begin() + d + 1, 1);
      std::vector<int64_t> pads(2 * split.size(), 0);
      pads[2 * (d + 1) + 1] = step - 1;
      r = pad(reshape(r, split), pads);
      Shape merged = r.shape();
      merged[d] *= step;
      merged.erase(merged.begin() + d + 1);
      r = reshape(r, merged);
      if (start + n * step > shape[d]) r = slice(r, d, 0, shape[d] - start);
    }
    std::vector<int64_t> pads(2 * shape.size(), 0);
    pads[2 * d] = start;
    pads[2 * d + 1] = shape[d] - start - r.shape()[d];
    if (pads[2 * d] != 0 || pads[2 * d + 1] != 0) r = pad(r, pads);
  }
  return {r};
}

Grads grad_concat(const Ctx& c, const Tensor& g) {
  const int64_t axis = c.attrs.ints[0];
  Grads out;
  int64_t at = 0;
  for (const Tensor& x : c.inputs) {
    out.push_back(slice(g, axis, at, at + x.shape()[axis]));
    at += x.shape()[axis];
  }
  return out;
}

Grads grad_broadcast(const Ctx&, const Tensor& g) {
  return {g};
}  // sum_to does the work

Grads grad_pad(const Ctx& c, const Tensor& g) {
  Tensor r = g;
  const Shape& shape = in(c, 0).shape();
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    const int64_t before = c.attrs.ints[2 * d];
    if (r.shape()[d] != shape[d]) r = slice(r, d, before, before + shape[d]);
  }
  return {r};
}

// C = op(A) op(B); d op(A) = G op(B)^T, d op(B) = op(A)^T G, transposed back when stored so.
Grads grad_matmul(const Ctx& c, const Tensor& g) {
  const bool ta = (c.attrs.flag & 1) != 0, tb = (c.attrs.flag & 2) != 0;
  const Tensor &a = in(c, 0), &b = in(c, 1);
  Tensor da = ta ? matmul(b, g, tb, true) : matmul(g, b, false, !tb);
  Tensor db = tb ? matmul(g, a, true, ta) : matmul(a, g, !ta, false);
  return {da, db};
}

std::vector<int64_t> ints(const Attrs& a, size_t from, size_t n) {
  return {a.ints.begin() + static_cast<ptrdiff_t>(from),
          a.ints.begin() + static_cast<ptrdiff_t>(from + n)};
}

std::vector<int64_t> spatial(const Tensor& t) {
  return {t.shape()[2], t.shape()[3]};
}

Grads grad_conv2d(const Ctx& c, const Tensor& g) {
  const Tensor &x = in(c, 0), &w = in(c, 1);
  const auto stride = ints(c.attrs, 0, 2), padding = ints(c.attrs, 2, 2);
  return {conv2d_grad_input(g, w, stride, padding, spatial(x)),
          conv2d_grad_weight(x, g, stride, padding, spatial(w))};
}

Grads grad_max_pool2d(const Ctx& c, const Tensor& g) {
  return {
      max_pool2d_grad(in(c, 0), g, ints(c.attrs, 0, 2), ints(c.attrs, 2, 2), ints(c.attrs, 4, 2))};
}

Grads grad_avg_pool2d(const Ctx& c, const Tensor& g) {
  return {avg_pool2d_grad(g, spatial(in(c, 0)), ints(c.attrs, 0, 2), ints(c.attrs, 2, 2),
                          ints(c.attrs, 4, 2))};
}

Grads grad_scatter_add(const Ctx& c, const Tensor& g) {
  return {Tensor(), gather(g, c.attrs.ints[0], in(c, 0))};
}

Grads grad_gather(const Ctx& c, const Tensor& g) {
  return {scatter_add(in(c, 1), g, c.attrs.ints[0], in(c, 0).shape()), Tensor()};
}

Grads grad_embedding(const Ctx& c, const Tensor& g) {
  return {embedding_grad(in(c, 1), g, in(c, 0).shape()[0]), Tensor()};
}

Grads grad_embedding_grad(const Ctx& c, const Tensor& g) {
  return {Tensor(), embedding(g, in(c, 0))};
}

// gamma's and beta's gradients sum over every axis but the last.
Grads grad_layer_norm(const Ctx& c, const Tensor& g) {
  const Tensor &x = in(c, 0), &gamma = in(c, 1);
  std::vector<int64_t> rows(static_cast<size_t>(x.dim() - 1));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  const Tensor dbeta = rows.empty() ? g : sum(g, rows);
  return {layer_norm_grad_input(x, gamma, g, c.attrs.scalar),
          layer_norm_grad_gamma(x, gamma, g, c.attrs.scalar), dbeta};
}

Grads grad_softmax(const Ctx& c, const Tensor& g) {
  return {softmax_grad(c.output, g, c.attrs.flag == 1)};
}

// Sum and mean are linear and the same on every replica's gradient; max/min are not supported.
Grads grad_all_reduce(const Ctx& c, const Tensor& g) {
  const auto op = static_cast<ReduceOp>(c.attrs.flag);
  if (op != ReduceOp::kSum && op != ReduceOp::kMean) {
    throw InvalidArgument(
        "backward: all_reduce with max/min has no gradient rule; detach() its result");
  }
  return {all_reduce(g, op)};
}

}  // namespace

GradRule grad_rule(Op op) {
  static constexpr GradRule kRules[] = {
#define XS_OP(en, name, arity, kind, rule, grad) grad,
#include "xla_spawn/runtime/ops.def"
#undef XS_OP
  };
  return kRules[static_cast<int>(op)];
}

}  // namespace xs
