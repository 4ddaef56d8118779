#include "xla_spawn/runtime/ops.h"

#include <algorithm>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autocast.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {

Tensor record(Op op, const std::vector<Tensor>& given, Attrs attrs, SourceLoc loc) {
  detail::SiteScope scope(loc);
  const bool policy = detail::precision_policy_on();
  std::vector<Tensor> adjusted;  // copied only when a precision policy is on
  if (policy) {
    adjusted = given;
    detail::apply_precision(op, adjusted, attrs);
  }
  const std::vector<Tensor>& operands = policy ? adjusted : given;
  std::vector<NodePtr> nodes;
  nodes.reserve(operands.size());
  for (const Tensor& t : operands) {
    if (!t.defined()) throw InvalidArgument(fmt::format("{}: an operand is an undefined tensor", op_name(op)));
    nodes.push_back(t.ir());
  }
  Tensor result = Tensor::from_ir(make_node(op, std::move(nodes), attrs));
  attach_grad_fn(result, op, attrs, operands);
  return result;
}

#define XS_UNARY(fn, op)                      \
  Tensor fn(const Tensor& x, SourceLoc loc) { \
    return record(Op::op, {x}, {}, loc);      \
  }
XS_UNARY(neg, kNeg)
XS_UNARY(abs, kAbs)
XS_UNARY(sign, kSign)
XS_UNARY(square, kSquare)
XS_UNARY(relu, kRelu)
XS_UNARY(exp, kExp)
XS_UNARY(log, kLog)
XS_UNARY(sqrt, kSqrt)
XS_UNARY(rsqrt, kRsqrt)
XS_UNARY(reciprocal, kReciprocal)
XS_UNARY(tanh, kTanh)
XS_UNARY(sigmoid, kSigmoid)
XS_UNARY(gelu, kGelu)
XS_UNARY(erf, kErf)
XS_UNARY(sin, kSin)
XS_UNARY(cos, kCos)
XS_UNARY(logical_not, kLogicalNot)
#undef XS_UNARY

#define XS_BINARY(fn, op)                                      \
  Tensor fn(const Tensor& a, const Tensor& b, SourceLoc loc) { \
    return record(Op::op, {a, b}, {}, loc);                    \
  }
XS_BINARY(add, kAdd)
XS_BINARY(sub, kSub)
XS_BINARY(mul, kMul)
XS_BINARY(div, kDiv)
XS_BINARY(maximum, kMaximum)
XS_BINARY(minimum, kMinimum)
XS_BINARY(pow, kPow)
XS_BINARY(eq, kEq)
XS_BINARY(ne, kNe)
XS_BINARY(lt, kLt)
XS_BINARY(le, kLe)
XS_BINARY(gt, kGt)
XS_BINARY(ge, kGe)
XS_BINARY(logical_and, kLogicalAnd)
XS_BINARY(logical_or, kLogicalOr)
#undef XS_BINARY

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, SourceLoc loc) {
  detail::SiteScope scope(loc);
  return record(Op::kWhere, {cond, a, b});
}

Tensor cast(const Tensor& x, DType dtype, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.dtype = dtype;
  return record(Op::kCast, {x}, std::move(a));
}

// The scalar made for a double operand takes the caller's line too.
Tensor operator+(OperandAt a, const Tensor& b) {
  return add(a.tensor, b, a.loc);
}
Tensor operator-(OperandAt a, const Tensor& b) {
  return sub(a.tensor, b, a.loc);
}
Tensor operator*(OperandAt a, const Tensor& b) {
  return mul(a.tensor, b, a.loc);
}
Tensor operator/(OperandAt a, const Tensor& b) {
  return div(a.tensor, b, a.loc);
}
Tensor operator-(OperandAt a) {
  return neg(a.tensor, a.loc);
}

#define XS_SCALAR_OPERATORS(sym, fn)                                        \
  Tensor operator sym(OperandAt a, double b) {                              \
    return fn(a.tensor, Tensor::scalar(b, a.tensor.dtype(), a.loc), a.loc); \
  }                                                                         \
  Tensor operator sym(double a, OperandAt b) {                              \
    return fn(Tensor::scalar(a, b.tensor.dtype(), b.loc), b.tensor, b.loc); \
  }
XS_SCALAR_OPERATORS(+, add)
XS_SCALAR_OPERATORS(-, sub)
XS_SCALAR_OPERATORS(*, mul)
XS_SCALAR_OPERATORS(/, div)
#undef XS_SCALAR_OPERATORS

namespace {

std::vector<int64_t> normalize_axes(std::vector<int64_t> axes, int64_t rank, std::string_view op) {
  if (axes.empty()) {
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
    return axes;
  }
  for (int64_t& a : axes) a = normalize_axis(a, rank, op);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    throw InvalidArgument(fmt::format("{}: repeated axis", op));
  return axes;
}

Tensor reduce(Op op, const Tensor& x, std::vector<int64_t> axes, bool keepdim) {
  Attrs a;
  a.ints = normalize_axes(std::move(axes), x.dim(), op_name(op));
  a.flag = keepdim;
  return record(op, {x}, std::move(a));
}

}  // namespace

Tensor sum(const Tensor& x, std::vector<int64_t> axes, bool keepdim, SourceLoc loc) {
  detail::SiteScope scope(loc);
  return reduce(Op::kSum, x, std::move(axes), keepdim);
}
Tensor mean(const Tensor& x, std::vector<int64_t> axes, bool keepdim, SourceLoc loc) {
  detail::SiteScope scope(loc);
  return reduce(Op::kMean, x, std::move(axes), keepdim);
}
Tensor max(const Tensor& x, std::vector<int64_t> axes, bool keepdim, SourceLoc loc) {
  detail::SiteScope scope(loc);
  return reduce(Op::kMax, x, std::move(axes), keepdim);
}
Tensor min(const Tensor& x, std::vector<int64_t> axes, bool keepdim, SourceLoc loc) {
  detail::SiteScope scope(loc);
  return reduce(Op::kMin, x, std::move(axes), keepdim);
}

Tensor argmax(const Tensor& x, int64_t axis, bool keepdim, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.ints = {normalize_axis(axis, x.dim(), "argmax")};
  a.flag = keepdim;
  return record(Op::kArgmax, {x}, std::move(a));
}

Tensor reshape(const Tensor& x, std::vector<int64_t> shape, SourceLoc loc) {
  detail::SiteScope scope(loc);
  auto minus = std::find(shape.begin(), shape.end(), -1);
  if (minus != shape.end()) {
    int64_t known = 1;
    for (int64_t d : shape) if (d != -1) known *= d;
    if (known == 0 || x.numel() % known != 0)
      throw InvalidArgument(fmt::format("reshape: cannot infer -1 in {} from {}", shape_str(shape), shape_str(x.shape())));
    *minus = x.numel() / known;
  }
  Attrs a;
  a.ints = std::move(shape);
  return record(Op::kReshape, {x}, std::move(a));
}

Tensor permute(const Tensor& x, std::vector<int64_t> perm, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  for (int64_t& p : perm) p = normalize_axis(p, x.dim(), "permute");
  a.ints = std::move(perm);
  return record(Op::kPermute, {x}, std::move(a));
}

Tensor transpose(const Tensor& x, int64_t axis0, int64_t axis1, SourceLoc loc) {
  detail::SiteScope scope(loc);
  std::vector<int64_t> perm(x.dim());
  for (int64_t i = 0; i < x.dim(); ++i) perm[i] = i;
  std::swap(perm[normalize_axis(axis0, x.dim(), "transpose")], perm[normalize_axis(axis1, x.dim(), "transpose")]);
  return permute(x, std::move(perm));
}

Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step,
             SourceLoc loc) {
  detail::SiteScope scope(loc);
  const int64_t ax = normalize_axis(axis, x.dim(), "slice");
  Attrs a;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d == ax) a.ints.insert(a.ints.end(), {start, stop, step});
    else a.ints.insert(a.ints.end(), {0, x.shape()[d], 1});
  }
  return record(Op::kSlice, {x}, std::move(a));
}

Tensor concat(const std::vector<Tensor>& xs, int64_t axis, SourceLoc loc) {
  detail::SiteScope scope(loc);
  if (xs.empty()) throw InvalidArgument("concat: no tensors");
  Attrs a;
  a.ints = {normalize_axis(axis, xs[0].dim(), "concat")};
  return record(Op::kConcat, xs, std::move(a));
}

Tensor broadcast_to(const Tensor& x, const Shape& shape, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.ints = shape;
  return record(Op::kBroadcast, {x}, std::move(a));
}

Tensor pad(const Tensor& x, std::vector<int64_t> pads, double value, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.ints = std::move(pads);
  a.scalar = value;
  return record(Op::kPad, {x}, std::move(a));
}

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs at;
  at.flag = (transpose_a ? 1 : 0) | (transpose_b ? 2 : 0);
  return record(Op::kMatmul, {a, b}, std::move(at));
}

Tensor conv2d(const Tensor& x, const Tensor& weight, std::vector<int64_t> stride,
              std::vector<int64_t> padding, SourceLoc loc) {
  detail::SiteScope scope(loc);
  if (stride.size() != 2 || padding.size() != 2) throw InvalidArgument("conv2d: stride and padding are {h, w}");
  Attrs a;
  a.ints = {stride[0], stride[1], padding[0], padding[1]};
  return record(Op::kConv2d, {x, weight}, std::move(a));
}

namespace {

Tensor pool(Op op, const Tensor& x, const std::vector<int64_t>& k, const std::vector<int64_t>& s,
            const std::vector<int64_t>& p) {
  if (k.size() != 2 || s.size() != 2 || p.size() != 2)
    throw InvalidArgument(fmt::format("{}: kernel, stride and padding are {{h, w}}", op_name(op)));
  Attrs a;
  a.ints = {k[0], k[1], s[0], s[1], p[0], p[1]};
  return record(op, {x}, std::move(a));
}

Tensor random(Op op, const Shape& shape, DType dtype, Tensor seed, std::vector<Tensor> extra) {
  if (!seed.defined()) seed = runtime().next_seed();
  Attrs a;
  a.ints = shape;
  a.dtype = dtype;
  extra.insert(extra.begin(), seed);
  return record(op, extra, std::move(a));
}

}  // namespace

Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, SourceLoc loc) {
  detail::SiteScope scope(loc);
  return pool(Op::kMaxPool2d, x, kernel, stride, padding);
}

Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, SourceLoc loc) {
  detail::SiteScope scope(loc);
  return pool(Op::kAvgPool2d, x, kernel, stride, padding);
}

namespace {

std::vector<int64_t> hw_attrs(std::string_view op, std::initializer_list<const std::vector<int64_t>*> parts) {
  std::vector<int64_t> ints;
  for (const std::vector<int64_t>* p : parts) {
    if (p->size() != 2) throw InvalidArgument(fmt::format("{}: stride, padding and sizes are {{h, w}}", op));
    ints.insert(ints.end(), p->begin(), p->end());
  }
  return ints;
}

}  // namespace

Tensor conv2d_grad_input(const Tensor& grad_out, const Tensor& weight, std::vector<int64_t> stride,
                         std::vector<int64_t> padding, std::vector<int64_t> input_hw,
                         SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.ints = hw_attrs("conv2d_grad_input", {&stride, &padding, &input_hw});
  return record(Op::kConv2dGradInput, {grad_out, weight}, std::move(a));
}

Tensor conv2d_grad_weight(const Tensor& x, const Tensor& grad_out, std::vector<int64_t> stride,
                          std::vector<int64_t> padding, std::vector<int64_t> kernel_hw,
                          SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.ints = hw_attrs("conv2d_grad_weight", {&stride, &padding, &kernel_hw});
  return record(Op::kConv2dGradWeight, {x, grad_out}, std::move(a));
}

Tensor max_pool2d_grad(const Tensor& x, const Tensor& grad_out, std::vector<int64_t> kernel,
                       std::vector<int64_t> stride, std::vector<int64_t> padding, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.ints = hw_attrs("max_pool2d_grad", {&kernel, &stride, &padding});
  return record(Op::kMaxPool2dGrad, {x, grad_out}, std::move(a));
}

Tensor max_pool2d_bias_relu_grad(const Tensor& x, const Tensor& bias, const Tensor& grad_out,
                                 std::vector<int64_t> kernel, std::vector<int64_t> stride,
                                 std::vector<int64_t> padding, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.ints = hw_attrs("max_pool2d_grad", {&kernel, &stride, &padding});
  return record(Op::kMaxPool2dGrad, {x, grad_out, bias}, std::move(a));
}

Tensor avg_pool2d_grad(const Tensor& grad_out, std::vector<int64_t> input_hw,
                       std::vector<int64_t> kernel, std::vector<int64_t> stride,
                       std::vector<int64_t> padding, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.ints = hw_attrs("avg_pool2d_grad", {&kernel, &stride, &padding, &input_hw});
  return record(Op::kAvgPool2dGrad, {grad_out}, std::move(a));
}

Tensor scatter_add(const Tensor& index, const Tensor& src, int64_t axis, const Shape& shape,
                   SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.ints = {normalize_axis(axis, static_cast<int64_t>(shape.size()), "scatter_add")};
  a.ints.insert(a.ints.end(), shape.begin(), shape.end());
  return record(Op::kScatterAdd, {index, src}, std::move(a));
}

Tensor gather(const Tensor& x, int64_t axis, const Tensor& index, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.ints = {normalize_axis(axis, x.dim(), "gather")};
  return record(Op::kGather, {x, index}, std::move(a));
}

Tensor one_hot(const Tensor& index, int64_t num_classes, DType dtype, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.ints = {num_classes};
  a.dtype = dtype;
  return record(Op::kOneHot, {index}, std::move(a));
}

Tensor embedding(const Tensor& table, const Tensor& index, SourceLoc loc) {
  detail::SiteScope scope(loc);
  return record(Op::kEmbedding, {table, index});
}

Tensor embedding_grad(const Tensor& index, const Tensor& grad, int64_t rows, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.ints = {rows};
  return record(Op::kEmbeddingGrad, {index, grad}, std::move(a));
}

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                  SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.scalar = eps;
  return record(Op::kLayerNorm, {x, gamma, beta}, std::move(a));
}

Tensor layer_norm_grad_input(const Tensor& x, const Tensor& gamma, const Tensor& grad_y, double eps,
                             SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.scalar = eps;
  return record(Op::kLayerNormGrad, {x, gamma, grad_y}, std::move(a));
}

Tensor layer_norm_grad_gamma(const Tensor& x, const Tensor& gamma, const Tensor& grad_y, double eps,
                             SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.scalar = eps;
  a.flag = 1;
  return record(Op::kLayerNormGrad, {x, gamma, grad_y}, std::move(a));
}

Tensor rand_uniform(const Shape& shape, DType dtype, Tensor seed, SourceLoc loc) {
  detail::SiteScope scope(loc);
  return random(Op::kRandUniform, shape, dtype, std::move(seed), {});
}
Tensor rand_normal(const Shape& shape, DType dtype, Tensor seed, SourceLoc loc) {
  detail::SiteScope scope(loc);
  return random(Op::kRandNormal, shape, dtype, std::move(seed), {});
}

Tensor bernoulli(const Shape& shape, double p, DType dtype, Tensor seed, SourceLoc loc) {
  detail::SiteScope scope(loc);
  // p as a data scalar even when 0 or 1, so changing the dropout rate never recompiles.
  BufferPtr buf = Buffer::allocate(sizeof(float));
  *buf->as<float>() = static_cast<float>(p);
  return random(Op::kBernoulli, shape, dtype, std::move(seed), {Tensor::from_buffer(buf, {{}, DType::kF32})});
}

Tensor all_reduce(const Tensor& x, ReduceOp op, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.flag = static_cast<int64_t>(op);
  return record(Op::kAllReduce, {x}, std::move(a));
}

Tensor logsumexp(const Tensor& given, int64_t axis, bool keepdim, SourceLoc loc) {
  detail::SiteScope scope(loc);
  const Tensor x = detail::autocast_to_f32(given);
  // Stable: shift by the max before exponentiating. The shift cancels in the value, so it is
  // detached: its gradient is zero and recording it would only add work to the backward.
  const Tensor m = detach(max(x, {axis}, true));
  Tensor out = log(sum(exp(x - m), {axis}, true)) + m;
  return keepdim ? out : reshape(out, [&] {
    Shape s = x.shape();
    s.erase(s.begin() + normalize_axis(axis, x.dim(), "logsumexp"));
    return s;
  }());
}

Tensor softmax(const Tensor& given, int64_t axis, SourceLoc loc) {
  detail::SiteScope scope(loc);
  const Tensor x = detail::autocast_to_f32(given);
  if (x.dim() > 0 && normalize_axis(axis, x.dim(), "softmax") == x.dim() - 1) return record(Op::kSoftmax, {x});
  const Tensor e = exp(x - detach(max(x, {axis}, true)));
  return e / sum(e, {axis}, true);
}

Tensor causal_softmax(const Tensor& scores, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.flag = 1;
  return record(Op::kSoftmax, {scores}, std::move(a));
}

Tensor softmax_grad(const Tensor& y, const Tensor& grad_y, bool causal, SourceLoc loc) {
  detail::SiteScope scope(loc);
  Attrs a;
  a.flag = causal ? 1 : 0;
  return record(Op::kSoftmaxGrad, {y, grad_y}, std::move(a));
}

Tensor log_softmax(const Tensor& given, int64_t axis, SourceLoc loc) {
  detail::SiteScope scope(loc);
  const Tensor x = detail::autocast_to_f32(given);
  // (x - m) - log(sum(exp(x - m))), not x - (m + log(...)): for large logits x and m cancel
  // in f32 (logits near 1e3 lost the 4th digit of the loss, near 1e8 all of it). The shift is
  // detached, as in logsumexp.
  const Tensor shifted = x - detach(max(x, {axis}, true));
  return shifted - log(sum(exp(shifted), {axis}, true));
}

}  // namespace xs
