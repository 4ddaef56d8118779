// Reductions (sum, mean, max, min, argmax) over any set of axes. Reduced axes are first
// brought to the [outer, reduced, inner] form (one contiguous run of axes, or a permuted
// copy otherwise); sums accumulate in double (floats) or int64 (integers), a whole contiguous
// run in row_sum.h's fixed lane order.
#include <cmath>
#include <limits>
#include <numeric>
#include <algorithm>
#include <vector>

#include "xla_spawn/base/check.h"
#include "xla_spawn/runtime/kernels/kernels.h"
#include "xla_spawn/runtime/kernels/loop.h"
#include "xla_spawn/runtime/kernels/row_sum.h"
#include "xla_spawn/runtime/element.h"

namespace xs::detail {
namespace {

struct Form {
  int64_t outer = 1, reduced = 1, inner = 1;
};

template <typename S> using Acc = std::conditional_t<std::is_integral_v<S>, int64_t, double>;

template <typename S>
Acc<S> value_of(S v) {
  if constexpr (std::is_same_v<S, BF16>) return v.to_float();
  else return static_cast<Acc<S>>(v);
}

template <typename A>
bool nan(A v) {
  if constexpr (std::is_floating_point_v<A>) return std::isnan(v);
  else return false;
}

template <typename S>
void store_acc(S* out, int64_t i, Acc<S> v) {
  if constexpr (std::is_same_v<S, BF16>) out[i] = BF16::from_float(static_cast<float>(v));
  else out[i] = static_cast<S>(v);
}

template <typename S>
void reduce_typed(Op op, const Form& f, const S* x, S* out) {
  std::vector<Acc<S>> acc(f.inner);
  for (int64_t o = 0; o < f.outer; ++o) {
    const S* base = x + o * f.reduced * f.inner;
    if (op == Op::kSum || op == Op::kMean) {
      if (f.inner == 1) {  // a whole run: lane sums, as an index-order sum is one long chain
        acc[0] = row_sum<Acc<S>>(f.reduced, [&](int64_t r) { return value_of(base[r]); });
      } else {
        std::fill(acc.begin(), acc.end(), Acc<S>(0));
        for (int64_t r = 0; r < f.reduced; ++r)
          for (int64_t i = 0; i < f.inner; ++i) acc[i] += value_of(base[r * f.inner + i]);
      }
      if (op == Op::kMean)
        for (auto& a : acc) a = f.reduced ? a / static_cast<Acc<S>>(f.reduced) : std::numeric_limits<double>::quiet_NaN();
    } else {
      const bool is_max = op == Op::kMax;
      for (int64_t i = 0; i < f.inner; ++i) acc[i] = value_of(base[i]);
      for (int64_t r = 1; r < f.reduced; ++r) {
        for (int64_t i = 0; i < f.inner; ++i) {
          const Acc<S> v = value_of(base[r * f.inner + i]);
          if (is_max ? (v > acc[i] || nan(v)) : (v < acc[i] || nan(v))) acc[i] = v;
        }
      }
    }
    for (int64_t i = 0; i < f.inner; ++i) store_acc(out, o * f.inner + i, acc[i]);
  }
}

// Brings the reduced axes of `in` into [outer, reduced, inner] form; returns the data to
// read (the input itself, or `scratch` holding a permuted copy).
const void* to_form(const std::vector<int64_t>& axes, const Arg& in, std::vector<char>& scratch, Form& f) {
  const Shape& s = in.type->shape;
  const int64_t rank = static_cast<int64_t>(s.size());
  if (axes.empty()) {  // nothing reduced
    f.outer = numel(s);
    return in.data;
  }
  if (const std::optional<LoopReduce> r = reduce_form(s, axes)) {  // the form a fused loop reads too
    f = {r->outer, r->reduced, r->inner};
    return in.data;
  }
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < rank; ++d)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) perm.push_back(d), f.outer *= s[d];
  for (int64_t d : axes) perm.push_back(d), f.reduced *= s[d];
  Shape ps;
  for (int64_t d : perm) ps.push_back(s[d]);
  scratch.resize(numel(s) * dtype_size(in.type->dtype));
  const ValueType pt{ps, in.type->dtype};
  permute_kernel(Attrs{perm, 0, DType::kF32, 0}, in, Arg{scratch.data(), &pt});
  return scratch.data();
}

// Sums over [pre, kept, post] with the reduced axes on both sides of one run of kept axes
// (a conv bias gradient: sum over N, H, W of NCHW) without the permuted copy: kept index m
// sums r = p * post + i in row_sum's lanes (r % 16), as the copy's rows would be summed.
// Returns false when the axes are not of that form.
template <typename S>
bool sum_around(Op op, const std::vector<int64_t>& axes, const Shape& s, const S* x, S* out) {
  const int64_t rank = static_cast<int64_t>(s.size());
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < rank; ++d)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) kept.push_back(d);
  if (kept.empty() || kept.front() == 0 || kept.back() == rank - 1 ||
      kept.back() - kept.front() + 1 != static_cast<int64_t>(kept.size())) return false;
  int64_t pre = 1, mid = 1, post = 1;
  for (int64_t d = 0; d < rank; ++d) (d < kept.front() ? pre : d <= kept.back() ? mid : post) *= s[d];
  std::vector<double> lanes(kSumLanes * mid, 0.0);  // lane l of m at l * mid + m
  for (int64_t p = 0; p < pre; ++p) {
    if (post < kSumLanes) {  // short runs ([N, C, 1, 1]): element by element, over m innermost
      for (int64_t i = 0; i < post; ++i) {
        double* lane = lanes.data() + ((p * post + i) % kSumLanes) * mid;
        const S* column = x + p * mid * post + i;
        for (int64_t m = 0; m < mid; ++m) lane[m] += static_cast<double>(column[m * post]);
      }
      continue;
    }
    const int64_t rot = (p * post) % kSumLanes;  // the lane of a run's first element
    for (int64_t m = 0; m < mid; ++m) {
      const S* run = x + (p * mid + m) * post;
      double t[kSumLanes];  // lane (rot + k) % 16 as t[k], so element i goes to t[i % 16]
      for (int64_t k = 0; k < kSumLanes; ++k) t[k] = lanes[((rot + k) % kSumLanes) * mid + m];
      int64_t i = 0;
      for (; i + kSumLanes <= post; i += kSumLanes)
        for (int64_t k = 0; k < kSumLanes; ++k) t[k] += static_cast<double>(run[i + k]);
      for (int64_t k = 0; i < post; ++i, ++k) t[k] += static_cast<double>(run[i]);
      for (int64_t k = 0; k < kSumLanes; ++k) lanes[((rot + k) % kSumLanes) * mid + m] = t[k];
    }
  }
  const double count = static_cast<double>(pre * post);
  for (int64_t m = 0; m < mid; ++m) {
    double total = 0;
    for (int64_t l = 0; l < kSumLanes; ++l) total += lanes[l * mid + m];
    out[m] = static_cast<S>(op == Op::kMean ? total / count : total);
  }
  return true;
}

}  // namespace

void reduce_kernel(Op op, const Attrs& attrs, const Arg& in, const Arg& out) {
  if ((op == Op::kSum || op == Op::kMean) && numel(in.type->shape) > 0) {
    const Shape& s = in.type->shape;
    if (in.type->dtype == DType::kF32 &&
        sum_around(op, attrs.ints, s, static_cast<const float*>(in.data), static_cast<float*>(out.data))) return;
    if (in.type->dtype == DType::kF64 &&
        sum_around(op, attrs.ints, s, static_cast<const double*>(in.data), static_cast<double*>(out.data))) return;
  }
  std::vector<char> scratch;
  Form f;
  const void* x = to_form(attrs.ints, in, scratch, f);
  switch (in.type->dtype) {
    case DType::kF32: return reduce_typed(op, f, static_cast<const float*>(x), static_cast<float*>(out.data));
    case DType::kF64: return reduce_typed(op, f, static_cast<const double*>(x), static_cast<double*>(out.data));
    case DType::kBF16: return reduce_typed(op, f, static_cast<const BF16*>(x), static_cast<BF16*>(out.data));
    case DType::kI32: return reduce_typed(op, f, static_cast<const int32_t*>(x), static_cast<int32_t*>(out.data));
    case DType::kI64: return reduce_typed(op, f, static_cast<const int64_t*>(x), static_cast<int64_t*>(out.data));
    case DType::kBool: XS_CHECK(false, "reduce on bool is rejected by the shape rule");
  }
}

void argmax_kernel(const Attrs& attrs, const Arg& in, const Arg& out) {
  std::vector<char> scratch;
  Form f;
  const void* x = to_form(attrs.ints, in, scratch, f);
  auto* result = static_cast<int64_t*>(out.data);
  for (int64_t o = 0; o < f.outer; ++o) {
    for (int64_t i = 0; i < f.inner; ++i) {
      int64_t best = 0;
      double best_v = load_element(x, in.type->dtype, o * f.reduced * f.inner + i);
      for (int64_t r = 1; r < f.reduced; ++r) {
        const double v = load_element(x, in.type->dtype, (o * f.reduced + r) * f.inner + i);
        if (v > best_v || (std::isnan(v) && !std::isnan(best_v))) best_v = v, best = r;  // the first NaN wins
      }
      result[o * f.inner + i] = best;
    }
  }
}

}  // namespace xs::detail
