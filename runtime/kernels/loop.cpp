#include "xla_spawn/runtime/kernels/loop.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/runtime/kernels/elementary.h"
#include "xla_spawn/runtime/kernels/random.h"
#include "xla_spawn/runtime/kernels/row_sum.h"
#include "xla_spawn/runtime/element.h"
#include "xla_spawn/runtime/shape.h"

namespace xs::detail {
namespace {

// Compute type per dtype: bf16 is computed in float and rounded when stored (or cast).
template <DType D> struct Compute;
template <> struct Compute<DType::kF32> { using T = float; };
template <> struct Compute<DType::kBF16> { using T = float; };
template <> struct Compute<DType::kF64> { using T = double; };
template <> struct Compute<DType::kI32> { using T = int32_t; };
template <> struct Compute<DType::kI64> { using T = int64_t; };
template <> struct Compute<DType::kBool> { using T = uint8_t; };

size_t compute_size(DType d) { return d == DType::kBF16 ? 4 : dtype_size(d); }

#define XS_MAP1(R, expr)                                                             \
  [](void* o, const void* pa, const void*, const void*, int64_t n) {                 \
    auto* out = static_cast<R*>(o);                                                  \
    auto* ap = static_cast<const T*>(pa);                                            \
    for (int64_t i = 0; i < n; ++i) {                                                \
      const T x = ap[i];                                                             \
      out[i] = static_cast<R>(expr);                                                 \
    }                                                                                \
  }
#define XS_MAP2(R, expr)                                                             \
  [](void* o, const void* pa, const void* pb, const void*, int64_t n) {              \
    auto* out = static_cast<R*>(o);                                                  \
    auto* ap = static_cast<const T*>(pa);                                            \
    auto* bp = static_cast<const T*>(pb);                                            \
    for (int64_t i = 0; i < n; ++i) {                                                \
      const T x = ap[i], y = bp[i];                                                  \
      out[i] = static_cast<R>(expr);                                                 \
    }                                                                                \
  }

template <typename T>
bool is_nan(T x) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(x);
  else return false;
}

// Signed integers wrap, as the generated code's add, sub and mul (no nsw) do: the arithmetic
// is done in the unsigned type, where overflow is defined (-INT_MIN is INT_MIN).
template <typename T>
T wrap(T x, T y, Op op) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    const U a = static_cast<U>(x), b = static_cast<U>(y);
    return static_cast<T>(op == Op::kAdd ? a + b : op == Op::kSub ? a - b : a * b);
  } else {
    return op == Op::kAdd ? x + y : op == Op::kSub ? x - y : x * y;
  }
}

template <typename T>
T neg_of(T x) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    return static_cast<T>(std::make_unsigned_t<T>(0) - static_cast<std::make_unsigned_t<T>>(x));
  } else {
    return -x;  // floats: -0.0 from 0.0, as fneg
  }
}

// No SIGFPE: x / 0 is 0, and x / -1 is -x wrapping (INT_MIN / -1 traps in hardware).
template <typename T>
T int_div(T x, T y) {
  if constexpr (std::is_floating_point_v<T>) {
    return x / y;
  } else {
    if (y == 0) return T(0);
    if (y == T(-1)) return neg_of(x);
    return static_cast<T>(x / y);
  }
}

template <typename T>
BlockFn numeric_fn(Op op) {
  switch (op) {
    case Op::kNeg: return XS_MAP1(T, neg_of(x));
    case Op::kAbs: return XS_MAP1(T, x < 0 ? neg_of(x) : x);
    case Op::kSign: return XS_MAP1(T, (x > 0) - (x < 0));
    case Op::kSquare: return XS_MAP1(T, wrap(x, x, Op::kMul));
    case Op::kRelu: return XS_MAP1(T, x > 0 ? x : T(0));
    case Op::kAdd: return XS_MAP2(T, wrap(x, y, Op::kAdd));
    case Op::kSub: return XS_MAP2(T, wrap(x, y, Op::kSub));
    case Op::kMul: return XS_MAP2(T, wrap(x, y, Op::kMul));
    case Op::kDiv: return XS_MAP2(T, int_div(x, y));
    case Op::kMaximum: return XS_MAP2(T, x > y || is_nan(x) ? x : y);
    case Op::kMinimum: return XS_MAP2(T, x < y || is_nan(x) ? x : y);
    case Op::kEq: return XS_MAP2(uint8_t, x == y);
    case Op::kNe: return XS_MAP2(uint8_t, x != y);
    case Op::kLt: return XS_MAP2(uint8_t, x < y);
    case Op::kLe: return XS_MAP2(uint8_t, x <= y);
    case Op::kGt: return XS_MAP2(uint8_t, x > y);
    case Op::kGe: return XS_MAP2(uint8_t, x >= y);
    case Op::kWhere:
      return [](void* o, const void* c, const void* a, const void* b, int64_t n) {
        auto* out = static_cast<T*>(o);
        auto* cp = static_cast<const uint8_t*>(c);
        auto* ap = static_cast<const T*>(a);
        auto* bp = static_cast<const T*>(b);
        for (int64_t i = 0; i < n; ++i) out[i] = cp[i] ? ap[i] : bp[i];
      };
    default: return nullptr;
  }
}

template <typename T>
BlockFn float_fn(Op op) {
  switch (op) {
    case Op::kExp: return XS_MAP1(T, exp_of(x));
    case Op::kLog: return XS_MAP1(T, std::log(x));
    case Op::kSqrt: return XS_MAP1(T, std::sqrt(x));
    case Op::kRsqrt: return XS_MAP1(T, T(1) / std::sqrt(x));
    case Op::kReciprocal: return XS_MAP1(T, T(1) / x);
    case Op::kTanh: return XS_MAP1(T, std::tanh(x));
    case Op::kSigmoid: return XS_MAP1(T, T(1) / (T(1) + exp_of(-x)));
    case Op::kGelu: return XS_MAP1(T, T(0.5) * x * (T(1) + erf_of(x * T(0.70710678118654752))));
    case Op::kErf: return XS_MAP1(T, erf_of(x));
    case Op::kSin: return XS_MAP1(T, std::sin(x));
    case Op::kCos: return XS_MAP1(T, std::cos(x));
    case Op::kPow: return XS_MAP2(T, std::pow(x, y));
    default: return numeric_fn<T>(op);
  }
}

BlockFn bool_fn(Op op) {
  using T = uint8_t;
  switch (op) {
    case Op::kLogicalNot: return XS_MAP1(T, !x);
    case Op::kLogicalAnd: return XS_MAP2(T, x && y);
    case Op::kLogicalOr: return XS_MAP2(T, x || y);
    case Op::kEq: return XS_MAP2(T, x == y);
    case Op::kNe: return XS_MAP2(T, x != y);
    case Op::kLt: return XS_MAP2(T, x < y);
    case Op::kLe: return XS_MAP2(T, x <= y);
    case Op::kGt: return XS_MAP2(T, x > y);
    case Op::kGe: return XS_MAP2(T, x >= y);
    case Op::kWhere: return numeric_fn<T>(op);
    default: return nullptr;
  }
}

#undef XS_MAP1
#undef XS_MAP2

template <typename From, typename To, bool kRoundBf16>
void cast_block(void* o, const void* a, const void*, const void*, int64_t n) {
  auto* out = static_cast<To*>(o);
  auto* in = static_cast<const From*>(a);
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (kRoundBf16) {
      out[i] = BF16::from_float(static_cast<float>(in[i])).to_float();
    } else if constexpr (std::is_same_v<To, uint8_t>) {
      out[i] = in[i] != From(0);
    } else {
      out[i] = static_cast<To>(in[i]);
    }
  }
}

template <typename From>
BlockFn cast_fn(DType to) {
  switch (to) {
    case DType::kF32: return &cast_block<From, float, false>;
    case DType::kBF16: return &cast_block<From, float, true>;
    case DType::kF64: return &cast_block<From, double, false>;
    case DType::kI32: return &cast_block<From, int32_t, false>;
    case DType::kI64: return &cast_block<From, int64_t, false>;
    case DType::kBool: return &cast_block<From, uint8_t, false>;
  }
  return nullptr;
}

}  // namespace

BlockFn elementwise_block_fn(Op op, DType in, DType out) {
  BlockFn fn = nullptr;
  if (op == Op::kCast) {
    switch (in) {
      case DType::kF32: case DType::kBF16: fn = cast_fn<float>(out); break;
      case DType::kF64: fn = cast_fn<double>(out); break;
      case DType::kI32: fn = cast_fn<int32_t>(out); break;
      case DType::kI64: fn = cast_fn<int64_t>(out); break;
      case DType::kBool: fn = cast_fn<uint8_t>(out); break;
    }
  } else {
    switch (in) {
      case DType::kF32: case DType::kBF16: fn = float_fn<float>(op); break;
      case DType::kF64: fn = float_fn<double>(op); break;
      case DType::kI32: fn = numeric_fn<int32_t>(op); break;
      case DType::kI64: fn = numeric_fn<int64_t>(op); break;
      case DType::kBool: fn = bool_fn(op); break;
    }
  }
  XS_CHECK(fn != nullptr, "no elementwise kernel for {} on {} -> {}", op_name(op), dtype_name(in),
           dtype_name(out));
  return fn;
}

namespace {

template <Op kOp, DType kOut>
void random_block(void* o, const void* seed, const void* index, const void* p, int64_t n) {
  using R = typename Compute<kOut>::T;
  auto* out = static_cast<R*>(o);
  const uint64_t s = static_cast<uint64_t>(*static_cast<const int64_t*>(seed));
  auto* idx = static_cast<const int64_t*>(index);
  for (int64_t i = 0; i < n; ++i) {
    const double pi = kOp == Op::kBernoulli ? static_cast<const float*>(p)[i] : 0.0;
    const R v = static_cast<R>(random_value(kOp, kOut, s, static_cast<uint64_t>(idx[i]), pi));
    // A bf16 draw is the bf16 value the op kernel stores, wherever a loop reads it.
    if constexpr (kOut == DType::kBF16) out[i] = BF16::from_float(v).to_float();
    else out[i] = v;
  }
}

template <Op kOp>
BlockFn random_fn(DType out) {
  switch (out) {
    case DType::kF32: return &random_block<kOp, DType::kF32>;
    case DType::kBF16: return &random_block<kOp, DType::kBF16>;
    case DType::kF64: return &random_block<kOp, DType::kF64>;
    default: return nullptr;
  }
}

}  // namespace

BlockFn random_block_fn(Op op, DType out) {
  BlockFn fn = op == Op::kRandUniform  ? random_fn<Op::kRandUniform>(out)
               : op == Op::kRandNormal ? random_fn<Op::kRandNormal>(out)
               : op == Op::kBernoulli  ? random_fn<Op::kBernoulli>(out)
                                       : nullptr;
  XS_CHECK(fn != nullptr, "no random kernel for {} -> {}", op_name(op), dtype_name(out));
  return fn;
}

namespace {

// The kRun form of `f` (operand shape padded to the loop's rank) against `to`, if it has it.
bool middle_run(const Shape& f, const Shape& to, LoadPlan* plan) {
  const size_t r = to.size();
  size_t a = 0, b = r;
  while (a < r && f[a] == 1) ++a;
  while (b > a && f[b - 1] == 1) --b;
  if (a == b) return false;
  for (size_t d = a; d < b; ++d)
    if (f[d] != to[d]) return false;
  *plan = {LoadMode::kRun, numel(Shape(to.begin() + static_cast<ptrdiff_t>(b), to.end())),
           numel(Shape(f.begin() + static_cast<ptrdiff_t>(a), f.begin() + static_cast<ptrdiff_t>(b)))};
  return true;
}

}  // namespace

LoadPlan load_plan(const LoopLoad& l, const Shape& to) {
  if (l.index) return {LoadMode::kIndex};
  if (l.storage < 0 || numel(l.shape) == 1) return {LoadMode::kFixed};
  if (l.shape == to) return {l.dtype == DType::kBF16 ? LoadMode::kConvert : LoadMode::kDirect};
  Shape f(to.size() - l.shape.size(), 1);
  f.insert(f.end(), l.shape.begin(), l.shape.end());
  const size_t r = to.size();
  size_t lead_ones = 0, lead_same = 0;
  while (lead_ones < r && f[lead_ones] == 1) ++lead_ones;
  while (lead_same < r && f[lead_same] == to[lead_same]) ++lead_same;
  bool tail_same = true, tail_ones = true;
  for (size_t d = lead_ones; d < r; ++d) tail_same &= f[d] == to[d];
  for (size_t d = lead_same; d < r; ++d) tail_ones &= f[d] == 1;
  if (tail_same) return {LoadMode::kTile, numel(l.shape)};
  if (tail_ones) return {LoadMode::kSpread, numel(Shape(to.begin() + lead_same, to.end()))};
  LoadPlan run;
  if (middle_run(f, to, &run)) return run;
  return {LoadMode::kBroadcast};
}


namespace {

// Element offsets (into the operand) of the `len` loop elements starting at flat index
// `begin`, for an operand broadcast from `from` to `to`.
void broadcast_offsets(const Shape& from, const Shape& to, int64_t begin, int64_t len,
                       int64_t* offsets) {
  const std::vector<int64_t> strides = broadcast_strides(from, to);
  const int64_t rank = static_cast<int64_t>(to.size());
  std::vector<int64_t> coord(rank);
  int64_t rest = begin, off = 0;
  for (int64_t d = rank - 1; d >= 0; --d) {
    coord[d] = rest % to[d];
    rest /= to[d];
    off += coord[d] * strides[d];
  }
  for (int64_t i = 0; i < len; ++i) {
    offsets[i] = off;
    for (int64_t d = rank - 1; d >= 0; --d) {  // odometer increment with carry
      off += strides[d];
      if (++coord[d] < to[d]) break;
      off -= strides[d] * to[d];
      coord[d] = 0;
    }
  }
}

template <typename S, typename C>
void gather_convert(const void* base, const int64_t* offsets, int64_t begin, int64_t len, void* out) {
  auto* src = static_cast<const S*>(base);
  auto* dst = static_cast<C*>(out);
  for (int64_t i = 0; i < len; ++i) {
    const S v = src[offsets ? offsets[i] : begin + i];
    if constexpr (std::is_same_v<S, BF16>) dst[i] = v.to_float();
    else dst[i] = v;
  }
}

// Loads `len` elements (contiguous from `begin`, or at `offsets`) into compute type.
void load_block(const void* base, DType dtype, const int64_t* offsets, int64_t begin, int64_t len,
                void* out) {
  switch (dtype) {
    case DType::kF32: return gather_convert<float, float>(base, offsets, begin, len, out);
    case DType::kBF16: return gather_convert<BF16, float>(base, offsets, begin, len, out);
    case DType::kF64: return gather_convert<double, double>(base, offsets, begin, len, out);
    case DType::kI32: return gather_convert<int32_t, int32_t>(base, offsets, begin, len, out);
    case DType::kI64: return gather_convert<int64_t, int64_t>(base, offsets, begin, len, out);
    case DType::kBool: return gather_convert<uint8_t, uint8_t>(base, offsets, begin, len, out);
  }
}

void store_block(const void* reg, DType dtype, int64_t begin, int64_t len, void* base) {
  if (dtype == DType::kBF16) {
    auto* src = static_cast<const float*>(reg);
    auto* dst = static_cast<BF16*>(base) + begin;
    for (int64_t i = 0; i < len; ++i) dst[i] = BF16::from_float(src[i]);
    return;
  }
  const size_t size = dtype_size(dtype);
  std::memcpy(static_cast<char*>(base) + begin * size, reg, len * size);
}

void fill_constant(DType dtype, double value, int64_t len, void* out) {
  for (int64_t i = 0; i < len; ++i) {
    switch (dtype) {
      case DType::kF32: case DType::kBF16: static_cast<float*>(out)[i] = static_cast<float>(value); break;
      case DType::kF64: static_cast<double*>(out)[i] = value; break;
      case DType::kI32: static_cast<int32_t*>(out)[i] = static_cast<int32_t>(value); break;
      case DType::kI64: static_cast<int64_t*>(out)[i] = static_cast<int64_t>(value); break;
      case DType::kBool: static_cast<uint8_t*>(out)[i] = value != 0; break;
    }
  }
}

// Writes `n` copies of the `sz`-byte value at `v` to `out`: typed loops for the usual sizes
// (a memcpy of a run-time size per element is a library call per element).
void splat(const void* v, size_t sz, int64_t n, char* out) {
  const auto fill = [&](auto tag) {
    using T = decltype(tag);
    T x;
    std::memcpy(&x, v, sizeof(T));
    std::fill_n(reinterpret_cast<T*>(out), n, x);
  };
  switch (sz) {
    case 1:
      return fill(uint8_t{});
    case 4:
      return fill(uint32_t{});
    case 8:
      return fill(uint64_t{});
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(out + i * sz, v, sz);
  }
}

// Loads `len` loop elements from `begin` for the tile/spread patterns, in contiguous runs.
void load_pattern(const LoopLoad& l, const LoadPlan& p, const void* base, int64_t begin, int64_t len, void* out) {
  const size_t sz = l.dtype == DType::kBF16 ? 4 : dtype_size(l.dtype);
  for (int64_t done = 0; done < len;) {
    const int64_t j = begin + done;
    if (p.mode == LoadMode::kTile) {
      const int64_t run = std::min(len - done, p.period - j % p.period);
      load_block(base, l.dtype, nullptr, j % p.period, run, static_cast<char*>(out) + done * sz);
      done += run;
    } else {
      const int64_t run = std::min(len - done, p.period - j % p.period);
      const int64_t src = p.mode == LoadMode::kRun ? (j / p.period) % p.count : j / p.period;
      double v[1];
      load_block(base, l.dtype, nullptr, src, 1, v);
      splat(v, sz, run, static_cast<char*>(out) + done * sz);
      done += run;
    }
  }
}

// A LoopReduce fed block by block in flat order (reduce.cpp's reduce_typed, element by element).
class Reducer {
 public:
  Reducer(const LoopReduce& r, const Shape& shape, DType reg_dtype, void* out)
      : r_(r), reg_dtype_(reg_dtype), out_(out), general_(!r.axes.empty()),
        acc_(general_ ? (sum() ? kSumLanes : 1) * r.outer : r.inner == 1 ? kSumLanes : r.inner),
        at_(r.op == Op::kArgmax ? r.inner : 0) {
    if (!general_) return;
    // Per axis: its extent and its step in o (kept) or in r (reduced), row-major among its kind.
    int64_t o_step = 1, r_step = 1;
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      const bool reduced = std::binary_search(r.axes.begin(), r.axes.end(), d);
      axes_.insert(axes_.begin(), {shape[d], reduced ? 0 : o_step, reduced ? r_step : 0});
      (reduced ? r_step : o_step) *= shape[d];
    }
  }

  void add(const void* reg, int64_t begin, int64_t len) {
    if (general_) return add_general(reg, begin, len);
    const int64_t inner = r_.inner, reduced = r_.reduced;
    int64_t i = begin % inner, rest = begin / inner;
    int64_t r = rest % reduced, o = rest / reduced;
    const bool is_max = r_.op == Op::kMax;
    for (int64_t k = 0; k < len; ++k) {
      const double v = value(reg, k);
      if (r_.op == Op::kArgmax) {
        if (r == 0 || v > acc_[i] || (std::isnan(v) && !std::isnan(acc_[i]))) acc_[i] = v, at_[i] = r;
      } else if (sum() && inner == 1) {
        if (r == 0) std::fill(acc_.begin(), acc_.end(), 0.0);
        acc_[r % kSumLanes] += v;
      } else if (sum()) {
        if (r == 0) acc_[i] = 0.0;
        acc_[i] += v;
      } else if (r == 0 || (is_max ? v > acc_[i] : v < acc_[i]) || std::isnan(v)) {
        acc_[i] = v;
      }
      if (r == reduced - 1) finish(o, i);
      if (++i < inner) continue;
      i = 0;
      if (++r < reduced) continue;
      r = 0;
      ++o;
    }
  }

  // The general form's values, once every element is in.
  void end() {
    if (!general_) return;
    for (int64_t o = 0; o < r_.outer; ++o) {
      double a = acc_[o];
      if (sum()) {
        a = 0;
        for (int64_t lane = 0; lane < kSumLanes; ++lane) a += acc_[o * kSumLanes + lane];
      }
      store(o, a);
    }
  }

 private:
  bool sum() const { return r_.op == Op::kSum || r_.op == Op::kMean; }

  double value(const void* reg, int64_t k) const {
    switch (reg_dtype_) {
      case DType::kF32: return static_cast<const float*>(reg)[k];
      case DType::kBF16: return BF16::from_float(static_cast<const float*>(reg)[k]).to_float();
      default: return static_cast<const double*>(reg)[k];
    }
  }

  // Elements begin .. begin + len - 1 by their coordinates: o and r follow each axis's step.
  void add_general(const void* reg, int64_t begin, int64_t len) {
    std::vector<int64_t> coord(axes_.size());
    int64_t o = 0, r = 0;
    for (int64_t d = static_cast<int64_t>(axes_.size()) - 1, rest = begin; d >= 0; --d) {
      coord[d] = rest % axes_[d].extent;
      rest /= axes_[d].extent;
      o += coord[d] * axes_[d].o_step;
      r += coord[d] * axes_[d].r_step;
    }
    const bool is_max = r_.op == Op::kMax;
    for (int64_t k = 0; k < len; ++k) {
      const double v = value(reg, k);
      if (sum()) {
        if (r == 0) std::fill_n(acc_.begin() + o * kSumLanes, kSumLanes, 0.0);
        acc_[o * kSumLanes + r % kSumLanes] += v;
      } else if (r == 0 || (is_max ? v > acc_[o] : v < acc_[o]) || std::isnan(v)) {
        acc_[o] = v;
      }
      for (int64_t d = static_cast<int64_t>(axes_.size()) - 1; d >= 0; --d) {  // the next element
        const Axis& a = axes_[d];
        if (++coord[d] < a.extent) {
          o += a.o_step, r += a.r_step;
          break;
        }
        coord[d] = 0;
        o -= (a.extent - 1) * a.o_step, r -= (a.extent - 1) * a.r_step;
      }
    }
  }

  void finish(int64_t o, int64_t i) {
    if (r_.op == Op::kArgmax) {
      static_cast<int64_t*>(out_)[o * r_.inner + i] = at_[i];
      return;
    }
    double a = acc_[i];
    if (sum() && r_.inner == 1) {
      a = 0;
      for (double lane : acc_) a += lane;
    }
    store(o * r_.inner + i, a);
  }

  void store(int64_t at, double a) {
    if (r_.op == Op::kMean) a /= static_cast<double>(r_.reduced);
    store_element(out_, r_.dtype, at, a);
  }

  struct Axis {
    int64_t extent, o_step, r_step;
  };

  const LoopReduce& r_;
  DType reg_dtype_;
  void* out_;
  bool general_;
  // Contiguous form: inner == 1 and a sum, row_sum's lanes; otherwise one per i. General
  // form: a sum's lanes per o (o * 16 + lane), else one per o.
  std::vector<double> acc_;
  std::vector<int64_t> at_;  // argmax: the r of acc_[i]
  std::vector<Axis> axes_;   // general form: per axis of the loop's shape
};

}  // namespace

std::optional<LoopReduce> reduce_form(const Shape& shape, const std::vector<int64_t>& axes) {
  if (axes.empty()) return std::nullopt;
  for (size_t k = 1; k < axes.size(); ++k)
    if (axes[k] != axes[k - 1] + 1) return std::nullopt;
  LoopReduce r{Op::kSum, -1, -1, DType::kF32, 1, 1, 1, {}};
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
    (d < axes.front() ? r.outer : d <= axes.back() ? r.reduced : r.inner) *= shape[d];
  return r;
}

LoopReduce loop_reduce_form(const Shape& shape, const std::vector<int64_t>& axes) {
  if (std::optional<LoopReduce> r = reduce_form(shape, axes)) return *r;
  LoopReduce r{Op::kSum, -1, -1, DType::kF32, 1, 1, 1, {}};
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
    (std::binary_search(axes.begin(), axes.end(), d) ? r.reduced : r.outer) *= shape[d];
  r.axes = axes;
  return r;
}

ReduceRow general_reduce_row(const Shape& shape, const std::vector<int64_t>& axes) {
  auto is_reduced = [&](int64_t d) { return std::binary_search(axes.begin(), axes.end(), d); };
  const auto rank = static_cast<int64_t>(shape.size());
  int64_t d = rank;
  while (d > 0 && shape[d - 1] == 1) --d;
  const bool reduced = d > 0 && is_reduced(d - 1);
  while (d > 0 && (shape[d - 1] == 1 || is_reduced(d - 1) == reduced)) --d;
  ReduceRow row{d, 1, reduced};
  for (int64_t a = d; a < rank; ++a) row.elements *= shape[a];
  return row;
}

int64_t reduce_scratch_doubles(const LoopReduce& r) {
  const bool sum = r.op == Op::kSum || r.op == Op::kMean;
  if (!r.axes.empty()) return (sum ? kSumLanes : 1) * r.outer;
  return r.inner == 1 ? 0 : r.inner;
}

void run_loop(const LoopKernel& loop, void* const* storage) {
  const int64_t n = numel(loop.shape);
  const size_t n_regs = loop.reg_dtype.size();
  constexpr size_t kRegBytes = kLoopBlock * 8;
  thread_local std::vector<double> scratch;  // doubles: 8-byte aligned for every compute type
  scratch.resize(n_regs * kLoopBlock);
  std::vector<void*> reg(n_regs);
  for (size_t r = 0; r < n_regs; ++r) reg[r] = reinterpret_cast<char*>(scratch.data()) + r * kRegBytes;
  std::vector<LoadPlan> plans;
  for (const LoopLoad& l : loop.loads) {
    plans.push_back(load_plan(l, loop.shape));
    if (plans.back().mode != LoadMode::kFixed) continue;
    if (l.storage < 0) {
      fill_constant(l.dtype, l.constant, kLoopBlock, reg[l.reg]);
    } else {
      double v[1];
      load_block(storage[l.storage], l.dtype, nullptr, 0, 1, v);
      const size_t sz = compute_size(l.dtype);
      for (int64_t i = 1; i < kLoopBlock; ++i) std::memcpy(static_cast<char*>(reg[l.reg]) + i * sz, v, sz);
      std::memcpy(reg[l.reg], v, sz);
    }
  }
  // A store whose storage no load reads is written by its step straight into the output
  // (no copy out of the register); an aliased one must wait until the block is fully loaded.
  std::vector<uint8_t> direct(loop.stores.size(), 0);
  for (size_t i = 0; i < loop.stores.size(); ++i) {
    const LoopStore& st = loop.stores[i];
    direct[i] = st.dtype != DType::kBF16 &&
                std::none_of(loop.loads.begin(), loop.loads.end(), [&](const LoopLoad& l) {
                  return l.storage == st.storage || l.reg == st.reg;
                });
  }
  std::optional<Reducer> reducer;
  if (loop.reduce) reducer.emplace(*loop.reduce, loop.shape, loop.reg_dtype[loop.reduce->reg], storage[loop.reduce->storage]);
  int64_t offsets[kLoopBlock];
  for (int64_t b = 0; b < n; b += kLoopBlock) {
    const int64_t len = std::min(kLoopBlock, n - b);
    for (size_t i = 0; i < loop.stores.size(); ++i) {
      if (direct[i]) reg[loop.stores[i].reg] = static_cast<char*>(storage[loop.stores[i].storage]) + b * dtype_size(loop.stores[i].dtype);
    }
    for (size_t i = 0; i < loop.loads.size(); ++i) {
      const LoopLoad& l = loop.loads[i];
      switch (plans[i].mode) {
        case LoadMode::kFixed: break;
        case LoadMode::kDirect:
          reg[l.reg] = static_cast<char*>(storage[l.storage]) + b * dtype_size(l.dtype);
          break;
        case LoadMode::kConvert: load_block(storage[l.storage], l.dtype, nullptr, b, len, reg[l.reg]); break;
        case LoadMode::kTile: case LoadMode::kSpread: case LoadMode::kRun:
          load_pattern(l, plans[i], storage[l.storage], b, len, reg[l.reg]);
          break;
        case LoadMode::kBroadcast:
          broadcast_offsets(l.shape, loop.shape, b, len, offsets);
          load_block(storage[l.storage], l.dtype, offsets, 0, len, reg[l.reg]);
          break;
        case LoadMode::kIndex:
          std::iota(static_cast<int64_t*>(reg[l.reg]), static_cast<int64_t*>(reg[l.reg]) + len, b);
          break;
      }
    }
    for (const LoopStep& s : loop.steps) {
      s.fn(reg[s.out], s.in[0] >= 0 ? reg[s.in[0]] : nullptr, s.in[1] >= 0 ? reg[s.in[1]] : nullptr,
           s.in[2] >= 0 ? reg[s.in[2]] : nullptr, len);
    }
    if (reducer) reducer->add(reg[loop.reduce->reg], b, len);
    for (size_t i = 0; i < loop.stores.size(); ++i) {
      if (!direct[i]) store_block(reg[loop.stores[i].reg], loop.stores[i].dtype, b, len, storage[loop.stores[i].storage]);
    }
  }
  if (reducer) reducer->end();
}

std::string loop_text(const LoopKernel& loop) {
  std::string out = fmt::format("loop {} regs={}:", shape_str(loop.shape), loop.reg_dtype.size());
  for (const LoopLoad& l : loop.loads) {
    out += l.index ? fmt::format(" r{}=index", l.reg)
           : l.storage < 0 ? fmt::format(" r{}=const({})", l.reg, l.constant)
                           : fmt::format(" r{}=load(s{}{})", l.reg, l.storage, shape_str(l.shape));
  }
  for (const LoopStep& s : loop.steps) out += fmt::format(" r{}={}", s.out, op_name(s.op));
  for (const LoopStore& s : loop.stores) out += fmt::format(" store(r{}->s{})", s.reg, s.storage);
  if (const auto& r = loop.reduce) {
    out += r->axes.empty()
               ? fmt::format(" {}(r{}->s{} over [{}, {}, {}])", op_name(r->op), r->reg, r->storage, r->outer, r->reduced, r->inner)
               : fmt::format(" {}(r{}->s{} over axes [{}])", op_name(r->op), r->reg, r->storage, fmt::join(r->axes, ","));
  }
  return out;
}

}  // namespace xs::detail
