#include "xla_spawn/runtime/detail/shape_rules.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "xla_spawn/base/error.h"

namespace xs::detail {
namespace {

[[noreturn]] void fail(Op op, std::span<const ValueType> in, const std::string& why) {
  std::string operands;
  for (const ValueType& t : in) operands += (operands.empty() ? "" : " and ") + type_str(t);
  throw InvalidArgument(fmt::format("{}: {} (operands {})", op_name(op), why, operands));
}

void require_same_dtype(Op op, std::span<const ValueType> in) {
  for (const ValueType& t : in) {
    if (t.dtype != in[0].dtype) fail(op, in, "operand dtypes differ");
  }
}

ValueType binary(Op op, std::span<const ValueType> in, DType result) {
  require_same_dtype(op, in);
  return {broadcast_shapes(in[0].shape, in[1].shape, op_name(op)), result};
}

int64_t rank_of(std::span<const ValueType> in) { return static_cast<int64_t>(in[0].shape.size()); }

}  // namespace

ValueType rule_leaf(Op op, std::span<const ValueType> in, const Attrs&) {
  fail(op, in, "leaves are made by make_data/make_const, not recorded");
}

ValueType rule_unary_numeric(Op op, std::span<const ValueType> in, const Attrs&) {
  if (in[0].dtype == DType::kBool) fail(op, in, "needs a numeric dtype");
  return in[0];
}

ValueType rule_unary_float(Op op, std::span<const ValueType> in, const Attrs&) {
  if (!is_float(in[0].dtype)) fail(op, in, "needs a floating dtype (f32, f64, bf16)");
  return in[0];
}

ValueType rule_unary_bool(Op op, std::span<const ValueType> in, const Attrs&) {
  if (in[0].dtype != DType::kBool) fail(op, in, "needs dtype bool");
  return in[0];
}

ValueType rule_binary_numeric(Op op, std::span<const ValueType> in, const Attrs&) {
  if (in[0].dtype == DType::kBool) fail(op, in, "needs a numeric dtype");
  return binary(op, in, in[0].dtype);
}

ValueType rule_binary_float(Op op, std::span<const ValueType> in, const Attrs&) {
  if (!is_float(in[0].dtype)) fail(op, in, "needs a floating dtype (f32, f64, bf16)");
  return binary(op, in, in[0].dtype);
}

ValueType rule_binary_bool(Op op, std::span<const ValueType> in, const Attrs&) {
  if (in[0].dtype != DType::kBool) fail(op, in, "needs dtype bool");
  return binary(op, in, DType::kBool);
}

ValueType rule_compare(Op op, std::span<const ValueType> in, const Attrs&) {
  return binary(op, in, DType::kBool);
}

ValueType rule_where(Op op, std::span<const ValueType> in, const Attrs&) {
  if (in[0].dtype != DType::kBool) fail(op, in, "condition must be bool");
  if (in[1].dtype != in[2].dtype) fail(op, in, "value dtypes differ");
  Shape s = broadcast_shapes(in[0].shape, in[1].shape, op_name(op));
  return {broadcast_shapes(s, in[2].shape, op_name(op)), in[1].dtype};
}

ValueType rule_cast(Op, std::span<const ValueType> in, const Attrs& attrs) {
  return {in[0].shape, attrs.dtype};
}

ValueType rule_reduce(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  const int64_t rank = rank_of(in);
  if (op != Op::kSum && in[0].dtype == DType::kBool) fail(op, in, "needs a numeric dtype");
  if (op == Op::kSum && in[0].dtype == DType::kBool) fail(op, in, "cast bool before summing");
  if (op == Op::kMean && !is_float(in[0].dtype)) fail(op, in, "needs a floating dtype");
  Shape out;
  for (int64_t i = 0; i < rank; ++i) {
    const bool reduced = std::find(attrs.ints.begin(), attrs.ints.end(), i) != attrs.ints.end();
    if (!reduced) out.push_back(in[0].shape[i]);
    else if (attrs.flag) out.push_back(1);
  }
  for (size_t i = 0; i < attrs.ints.size(); ++i) {
    if (attrs.ints[i] < 0 || attrs.ints[i] >= rank || (i > 0 && attrs.ints[i] <= attrs.ints[i - 1]))
      fail(op, in, fmt::format("axes [{}] must be sorted, unique and < rank {}",
                               fmt::join(attrs.ints, ", "), rank));
  }
  for (int64_t axis : attrs.ints) {  // an empty tensor is fine as long as no reduced axis is
    if ((op == Op::kMax || op == Op::kMin) && in[0].shape[axis] == 0)
      fail(op, in, fmt::format("max/min over the empty axis {} is undefined", axis));
  }
  return {out, in[0].dtype};
}

ValueType rule_argmax(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (attrs.ints.size() != 1) fail(op, in, "needs exactly one axis");
  Attrs one = attrs;
  ValueType t = rule_reduce(op, in, one);
  if (in[0].shape[attrs.ints[0]] == 0) fail(op, in, "argmax over an empty axis");
  return {t.shape, DType::kI64};
}

ValueType rule_reshape(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (std::any_of(attrs.ints.begin(), attrs.ints.end(), [](int64_t d) { return d < 0; }) ||
      numel(attrs.ints) != numel(in[0].shape))
    fail(op, in, fmt::format("cannot reshape to {}", shape_str(attrs.ints)));
  return {attrs.ints, in[0].dtype};
}

ValueType rule_permute(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  const int64_t rank = rank_of(in);
  std::vector<int64_t> sorted = attrs.ints;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < rank; ++i) {
    if (static_cast<int64_t>(sorted.size()) != rank || sorted[i] != i)
      fail(op, in, fmt::format("[{}] is not a permutation of {} axes", fmt::join(attrs.ints, ", "), rank));
  }
  Shape out(rank);
  for (int64_t i = 0; i < rank; ++i) out[i] = in[0].shape[attrs.ints[i]];
  return {out, in[0].dtype};
}

ValueType rule_slice(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  const int64_t rank = rank_of(in);
  if (static_cast<int64_t>(attrs.ints.size()) != 3 * rank) fail(op, in, "needs start, stop, step per axis");
  Shape out(rank);
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t start = attrs.ints[3 * i], stop = attrs.ints[3 * i + 1], step = attrs.ints[3 * i + 2];
    if (step < 1 || start < 0 || stop < start || stop > in[0].shape[i])
      fail(op, in, fmt::format("axis {}: bad range {}:{}:{} for size {}", i, start, stop, step, in[0].shape[i]));
    out[i] = (stop - start + step - 1) / step;
  }
  return {out, in[0].dtype};
}

ValueType rule_concat(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  require_same_dtype(op, in);
  const int64_t rank = rank_of(in);
  if (attrs.ints.size() != 1 || attrs.ints[0] < 0 || attrs.ints[0] >= rank) fail(op, in, "bad axis");
  Shape out = in[0].shape;
  for (size_t k = 1; k < in.size(); ++k) {
    Shape s = in[k].shape;
    if (static_cast<int64_t>(s.size()) != rank) fail(op, in, "ranks differ");
    out[attrs.ints[0]] += s[attrs.ints[0]];
    s[attrs.ints[0]] = in[0].shape[attrs.ints[0]];
    if (s != in[0].shape) fail(op, in, fmt::format("shapes differ off axis {}", attrs.ints[0]));
  }
  return {out, in[0].dtype};
}

ValueType rule_broadcast(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (broadcast_shapes(in[0].shape, attrs.ints, op_name(op)) != attrs.ints)
    fail(op, in, fmt::format("cannot broadcast to {}", shape_str(attrs.ints)));
  return {attrs.ints, in[0].dtype};
}

ValueType rule_pad(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  const int64_t rank = rank_of(in);
  if (static_cast<int64_t>(attrs.ints.size()) != 2 * rank) fail(op, in, "needs before, after per axis");
  Shape out = in[0].shape;
  for (int64_t i = 0; i < rank; ++i) {
    if (attrs.ints[2 * i] < 0 || attrs.ints[2 * i + 1] < 0) fail(op, in, "negative padding");
    out[i] += attrs.ints[2 * i] + attrs.ints[2 * i + 1];
  }
  return {out, in[0].dtype};
}

ValueType rule_matmul(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  require_same_dtype(op, in);
  const Shape& a = in[0].shape;
  const Shape& b = in[1].shape;
  if (a.size() < 2 || b.size() < 2) fail(op, in, "operands need rank >= 2");
  if (in[0].dtype == DType::kBool) fail(op, in, "needs a numeric dtype");
  const bool ta = attrs.flag & 1, tb = attrs.flag & 2;
  const int64_t m = a[a.size() - (ta ? 1 : 2)], ka = a[a.size() - (ta ? 2 : 1)];
  const int64_t kb = b[b.size() - (tb ? 1 : 2)], n = b[b.size() - (tb ? 2 : 1)];
  if (ka != kb) fail(op, in, fmt::format("inner dimensions differ ({} vs {})", ka, kb));
  Shape out = broadcast_shapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2), op_name(op));
  out.push_back(m);
  out.push_back(n);
  return {out, in[0].dtype};
}

ValueType rule_conv2d(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (in.size() != 2 && in.size() != 3) fail(op, in, "takes (x, w) or (x, w, bias)");
  require_same_dtype(op, in);
  const Shape& x = in[0].shape;
  const Shape& w = in[1].shape;
  if (x.size() != 4 || w.size() != 4) fail(op, in, "needs NCHW input and OIHW weight");
  if (x[1] != w[1]) fail(op, in, fmt::format("input has {} channels, weight expects {}", x[1], w[1]));
  if (!is_float(in[0].dtype)) fail(op, in, "needs a floating dtype");
  if (in.size() == 3) {  // conv-bias-relu-pool: {stride, pad, 2, 2, 2, 2, 0, 0}, even output
    const std::vector<int64_t> pool(attrs.ints.begin() + std::min<size_t>(4, attrs.ints.size()), attrs.ints.end());
    const Attrs conv{{attrs.ints.begin(), attrs.ints.begin() + std::min<size_t>(4, attrs.ints.size())}, 0, DType::kF32, 0};
    const ValueType y = rule_conv2d(op, in.first(2), conv);
    if (pool != std::vector<int64_t>{2, 2, 2, 2, 0, 0} || y.shape[2] % 2 != 0 || y.shape[3] % 2 != 0)
      fail(op, in, "the fused form needs a 2x2 / stride 2 pool over an even-sized output");
    if (numel(in[2].shape) != w[0]) fail(op, in, fmt::format("bias must hold {} elements", w[0]));
    return {{2, y.shape[0], y.shape[1], y.shape[2] / 2, y.shape[3] / 2}, in[0].dtype};
  }
  const auto& p = attrs.ints;  // stride_h, stride_w, pad_h, pad_w
  if (p.size() != 4 || p[0] < 1 || p[1] < 1 || p[2] < 0 || p[3] < 0) fail(op, in, "bad stride/padding");
  const int64_t oh = (x[2] + 2 * p[2] - w[2]) / p[0] + 1, ow = (x[3] + 2 * p[3] - w[3]) / p[1] + 1;
  if (x[2] + 2 * p[2] < w[2] || x[3] + 2 * p[3] < w[3]) fail(op, in, "kernel larger than padded input");
  return {{x[0], w[0], oh, ow}, in[0].dtype};
}

ValueType rule_pool2d(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  const Shape& x = in[0].shape;
  const auto& p = attrs.ints;  // kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w
  if (x.size() != 4) fail(op, in, "needs NCHW input");
  if (!is_float(in[0].dtype)) fail(op, in, "needs a floating dtype");
  if (p.size() != 6 || p[0] < 1 || p[1] < 1 || p[2] < 1 || p[3] < 1 || p[4] < 0 || p[5] < 0 ||
      2 * p[4] > p[0] || 2 * p[5] > p[1])
    fail(op, in, fmt::format("bad kernel/stride/padding [{}]", fmt::join(p, ", ")));
  if (x[2] + 2 * p[4] < p[0] || x[3] + 2 * p[5] < p[1]) fail(op, in, "kernel larger than padded input");
  if (in.size() == 2) {  // max_pool2d(x, bias), made by the compiler: relu(max + bias[c])
    require_same_dtype(op, in);
    if (op != Op::kMaxPool2d || numel(in[1].shape) != x[1])
      fail(op, in, fmt::format("only max_pool2d takes a bias, of {} elements (one per channel)", x[1]));
  }
  return {{x[0], x[1], (x[2] + 2 * p[4] - p[0]) / p[2] + 1, (x[3] + 2 * p[5] - p[1]) / p[3] + 1},
          in[0].dtype};
}

ValueType rule_gather(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  const int64_t rank = rank_of(in);
  if (in[1].dtype != DType::kI32 && in[1].dtype != DType::kI64) fail(op, in, "index must be i32 or i64");
  if (attrs.ints.size() != 1 || attrs.ints[0] < 0 || attrs.ints[0] >= rank) fail(op, in, "bad axis");
  if (static_cast<int64_t>(in[1].shape.size()) != rank) fail(op, in, "index rank differs");
  for (int64_t i = 0; i < rank; ++i) {
    if (i != attrs.ints[0] && in[1].shape[i] != in[0].shape[i])
      fail(op, in, fmt::format("index and input differ on axis {}", i));
  }
  return {in[1].shape, in[0].dtype};
}

ValueType rule_one_hot(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (in[0].dtype != DType::kI32 && in[0].dtype != DType::kI64) fail(op, in, "index must be i32 or i64");
  if (attrs.ints.size() != 1 || attrs.ints[0] < 1) fail(op, in, "num_classes must be >= 1");
  Shape out = in[0].shape;
  out.push_back(attrs.ints[0]);
  return {out, attrs.dtype};
}

ValueType rule_embedding(Op op, std::span<const ValueType> in, const Attrs&) {
  if (in[0].shape.size() != 2 || !is_float(in[0].dtype)) fail(op, in, "the table must be a floating [rows, dim] matrix");
  if (in[1].dtype != DType::kI32 && in[1].dtype != DType::kI64) fail(op, in, "index must be i32 or i64");
  Shape out = in[1].shape;
  out.push_back(in[0].shape[1]);
  return {out, in[0].dtype};
}

ValueType rule_embedding_grad(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (in[0].dtype != DType::kI32 && in[0].dtype != DType::kI64) fail(op, in, "index must be i32 or i64");
  if (!is_float(in[1].dtype)) fail(op, in, "grad must be floating");
  const Shape& is = in[0].shape;
  const Shape& gs = in[1].shape;
  if (gs.size() != is.size() + 1 || !std::equal(is.begin(), is.end(), gs.begin()))
    fail(op, in, "grad must have the index's shape plus one trailing axis");
  if (attrs.ints.size() != 1 || attrs.ints[0] < 1) fail(op, in, "needs {rows of the table} >= 1");
  return {{attrs.ints[0], gs.back()}, in[1].dtype};
}

ValueType rule_layer_norm(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  require_same_dtype(op, in);
  if (!is_float(in[0].dtype)) fail(op, in, "needs a floating dtype (f32, f64, bf16)");
  if (in[0].shape.empty()) fail(op, in, "x needs at least one axis");
  const Shape features{in[0].shape.back()};
  if (in[1].shape != features || in[2].shape != features)
    fail(op, in, "gamma and beta must be vectors of x's last axis");
  if (!(attrs.scalar > 0)) fail(op, in, fmt::format("eps must be > 0, got {}", attrs.scalar));
  return in[0];
}

ValueType rule_layer_norm_grad(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  require_same_dtype(op, in);
  if (!is_float(in[0].dtype)) fail(op, in, "needs a floating dtype (f32, f64, bf16)");
  if (in[0].shape.empty() || in[2].shape != in[0].shape) fail(op, in, "grad_y must have x's shape");
  if (in[1].shape != Shape{in[0].shape.back()}) fail(op, in, "gamma must be a vector of x's last axis");
  if (attrs.flag != 0 && attrs.flag != 1) fail(op, in, "flag must be 0 (grad of x) or 1 (grad of gamma)");
  return attrs.flag == 0 ? in[0] : in[1];
}

ValueType rule_softmax(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  require_same_dtype(op, in);
  if (!is_float(in[0].dtype)) fail(op, in, "needs a floating dtype (f32, f64, bf16)");
  for (const ValueType& t : in) {
    if (t.shape != in[0].shape) fail(op, in, "y and grad_y shapes differ");
  }
  const Shape& s = in[0].shape;
  if (s.empty()) fail(op, in, "needs at least one axis");
  if (attrs.flag != 0 && attrs.flag != 1) fail(op, in, "flag must be 0 or 1 (causal)");
  if (attrs.flag == 1 && (s.size() < 2 || s[s.size() - 1] != s[s.size() - 2]))
    fail(op, in, "causal needs square [..., T, T] scores");
  return in[0];
}

ValueType rule_softmax_grad(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  return rule_softmax(op, in, attrs);
}

ValueType rule_random(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (in[0].dtype != DType::kI64 || !in[0].shape.empty()) fail(op, in, "seed must be an i64 scalar");
  if (!is_float(attrs.dtype)) fail(op, in, "result dtype must be floating");
  return {attrs.ints, attrs.dtype};
}

ValueType rule_bernoulli(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (in[1].dtype != DType::kF32 || !in[1].shape.empty()) fail(op, in, "p must be an f32 scalar");
  return rule_random(op, in.first(1), attrs);
}

ValueType rule_all_reduce(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (attrs.flag < 0 || attrs.flag >= kNumReduceOps) fail(op, in, "bad reduce op");
  if (in[0].dtype == DType::kBool) fail(op, in, "needs a numeric dtype");
  return in[0];
}

}  // namespace xs::detail

namespace xs::detail {
namespace {

// Spatial output size of a window op, or -1 when the window does not fit.
int64_t window_out(int64_t in, int64_t k, int64_t stride, int64_t pad) {
  return in + 2 * pad < k ? -1 : (in + 2 * pad - k) / stride + 1;
}

}  // namespace

namespace {

// The fused forms' grad_out, max_pool2d_grad(y, h[, bias]) with the pool attrs after the conv's
// six, for operands (.., h at gi, .., y, bias?); in itself for the plain two-operand form.
ValueType fused_grad_out(Op op, std::span<const ValueType> in, const Attrs& attrs, size_t gi) {
  if (in.size() == 2) return in[gi];
  if (in.size() == 3 && in[2].shape.size() == 5) {  // (.., h, .., fused conv2d's [2, N, C, H/2, W/2])
    const Shape& f = in[2].shape;
    if (f[0] != 2 || in[gi].shape != Shape(f.begin() + 1, f.end()))
      fail(op, in, "h must be the pooled shape of the fused conv2d's result");
    return {{f[1], f[2], 2 * f[3], 2 * f[4]}, in[gi].dtype};
  }
  if (in.size() > 4 || attrs.ints.size() != 12)
    fail(op, in, "the fused form takes (.., h, .., y[, bias]) and 6 conv + 6 pool attrs");
  std::vector<ValueType> pool_in{in[2], in[gi]};
  if (in.size() == 4) pool_in.push_back(in[3]);
  const Attrs pool{{attrs.ints.begin() + 6, attrs.ints.end()}, 0, DType::kF32, 0};
  return rule_max_pool2d_grad(op, pool_in, pool);
}

}  // namespace

ValueType rule_conv2d_grad_input(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (in.size() < 2) fail(op, in, "takes (grad_out, w) or (h, w, y[, bias])");
  require_same_dtype(op, in);
  const ValueType grad_out = fused_grad_out(op, in, attrs, 0);
  const Shape &g = grad_out.shape, &w = in[1].shape;
  const size_t n_conv = in.size() > 2 ? std::min<size_t>(6, attrs.ints.size()) : attrs.ints.size();
  const Attrs conv{{attrs.ints.begin(), attrs.ints.begin() + n_conv}, 0, DType::kF32, 0};
  const auto& p = conv.ints;  // stride_h, stride_w, pad_h, pad_w, in_h, in_w
  if (g.size() != 4 || w.size() != 4 || p.size() != 6 || p[0] < 1 || p[1] < 1 || p[2] < 0 || p[3] < 0)
    fail(op, in, "needs NCHW grad_out, OIHW weight and {stride, pad, input size}");
  if (g[1] != w[0]) fail(op, in, fmt::format("grad_out has {} channels, weight makes {}", g[1], w[0]));
  if (window_out(p[4], w[2], p[0], p[2]) != g[2] || window_out(p[5], w[3], p[1], p[3]) != g[3])
    fail(op, in, fmt::format("input size {}x{} does not give grad_out's {}x{}", p[4], p[5], g[2], g[3]));
  return {{g[0], w[1], p[4], p[5]}, in[0].dtype};
}

ValueType rule_conv2d_grad_weight(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (in.size() < 2) fail(op, in, "takes (x, grad_out) or (x, h, y[, bias])");
  require_same_dtype(op, in);
  const ValueType grad_out = fused_grad_out(op, in, attrs, 1);
  const Shape &x = in[0].shape, &g = grad_out.shape;
  const size_t n_conv = in.size() > 2 ? std::min<size_t>(6, attrs.ints.size()) : attrs.ints.size();
  const Attrs conv{{attrs.ints.begin(), attrs.ints.begin() + n_conv}, 0, DType::kF32, 0};
  const auto& p = conv.ints;  // stride_h, stride_w, pad_h, pad_w, k_h, k_w
  if (x.size() != 4 || g.size() != 4 || p.size() != 6 || p[0] < 1 || p[1] < 1 || p[2] < 0 || p[3] < 0)
    fail(op, in, "needs NCHW input, NCHW grad_out and {stride, pad, kernel size}");
  if (x[0] != g[0]) fail(op, in, "batch sizes differ");
  if (window_out(x[2], p[4], p[0], p[2]) != g[2] || window_out(x[3], p[5], p[1], p[3]) != g[3])
    fail(op, in, fmt::format("kernel {}x{} does not give grad_out's {}x{}", p[4], p[5], g[2], g[3]));
  return {{g[1], x[1], p[4], p[5]}, in[0].dtype};
}

// (x, grad_out) or (x, grad_out, bias): with a bias (C elements, any shape) the pooled input
// was relu(x + bias[c]), recomputed by the kernel (the compiler's bias-relu-pool fusion).
ValueType rule_max_pool2d_grad(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (in.size() != 2 && in.size() != 3) fail(op, in, "takes (x, grad_out) or (x, grad_out, bias)");
  require_same_dtype(op, in);
  const ValueType pooled = rule_pool2d(op, in.first(1), attrs);
  if (pooled.shape != in[1].shape) fail(op, in, fmt::format("grad_out must be {}", shape_str(pooled.shape)));
  if (in.size() == 3 && numel(in[2].shape) != in[0].shape[1])
    fail(op, in, fmt::format("bias must hold {} elements (one per channel)", in[0].shape[1]));
  return in[0];
}

ValueType rule_avg_pool2d_grad(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  const Shape& g = in[0].shape;
  if (g.size() != 4 || attrs.ints.size() != 8) fail(op, in, "needs NCHW grad_out and pool attrs + {in_h, in_w}");
  const ValueType input{{g[0], g[1], attrs.ints[6], attrs.ints[7]}, in[0].dtype};
  const Attrs pool{{attrs.ints.begin(), attrs.ints.begin() + 6}, 0, DType::kF32, 0};
  if (rule_pool2d(op, std::span<const ValueType>(&input, 1), pool).shape != g)
    fail(op, in, fmt::format("input size {}x{} does not pool to grad_out", attrs.ints[6], attrs.ints[7]));
  return input;
}

ValueType rule_scatter_add(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (in[0].dtype != DType::kI32 && in[0].dtype != DType::kI64) fail(op, in, "index must be i32 or i64");
  if (in[0].shape != in[1].shape) fail(op, in, "index and src shapes differ");
  if (in[1].dtype == DType::kBool) fail(op, in, "needs a numeric src");
  const Shape out(attrs.ints.begin() + (attrs.ints.empty() ? 0 : 1), attrs.ints.end());
  const int64_t rank = static_cast<int64_t>(out.size());
  if (attrs.ints.empty() || attrs.ints[0] < 0 || attrs.ints[0] >= rank || rank != static_cast<int64_t>(in[0].shape.size()))
    fail(op, in, "needs {axis, result shape} with the index's rank");
  for (int64_t i = 0; i < rank; ++i) {
    if (i != attrs.ints[0] && out[i] != in[0].shape[i]) fail(op, in, fmt::format("result and index differ on axis {}", i));
  }
  return {out, in[1].dtype};
}

}  // namespace xs::detail
