// Acceptance 1: every op in runtime/ops.def, lazily recorded and run through mark_step,
// against the naive reference in reference.h on random inputs of several shapes (broadcast,
// empty, odd), with per-op tolerances. An op without a case fails the walk.
#include <cmath>
#include <functional>
#include <map>
#include <numbers>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"
#include "tests/runtime/reference.h"

namespace xs::testing {
namespace {

struct Tol {
  double rtol = 1e-5, atol = 1e-6;
};

Tol tol_for(DType d) {
  if (d == DType::kBF16) return {2e-2, 2e-2};
  if (d == DType::kF64) return {1e-12, 1e-12};
  if (d == DType::kF32) return {2e-5, 2e-6};
  return {0, 0};
}

void expect_close(const Host& got, const Host& want, Tol tol, const std::string& what) {
  ASSERT_EQ(got.shape, want.shape) << what;
  ASSERT_EQ(got.dtype, want.dtype) << what;
  for (size_t i = 0; i < want.v.size(); ++i) {
    const double g = got.v[i], w = want.v[i];
    if (std::isnan(w) && std::isnan(g)) continue;
    ASSERT_LE(std::abs(g - w), tol.atol + tol.rtol * std::abs(w))
        << what << " element " << i << ": got " << g << ", want " << w;
  }
}

// Runs `t` through mark_step (not a host-read sync) and returns it on the host.
Host run(const Tensor& t) {
  mark_step();
  EXPECT_FALSE(t.is_pending());
  return from_tensor(t);
}

using Case = std::function<void(std::mt19937&)>;
using Fn1 = std::function<double(double)>;
using Fn2 = std::function<double(double, double)>;

const std::vector<Shape> kUnaryShapes = {{}, {7}, {3, 5}, {2, 0, 3}, {2, 3, 33}};
const std::vector<std::pair<Shape, Shape>> kBinaryShapes = {
    {{3, 4}, {3, 4}}, {{3, 1}, {1, 4}}, {{5}, {2, 5}}, {{}, {3}}, {{0, 3}, {1, 3}}, {{2, 3, 1}, {3, 5}}, {{257}, {257}}};

Case unary(Op op, Fn1 f, std::vector<DType> dtypes, double lo = -2, double hi = 2) {
  return [=](std::mt19937& rng) {
    for (DType d : dtypes)
      for (const Shape& s : kUnaryShapes) {
        const Host x = random_host(s, d, rng, lo, hi);
        const Host want = ref_map({&x}, d, [&](const auto& a) { return f(a[0]); });
        expect_close(run(record(op, {to_tensor(x)})), want, tol_for(d),
                     fmt::format("{} {}{}", op_name(op), dtype_name(d), shape_str(s)));
      }
  };
}

Case binary(Op op, Fn2 f, std::vector<DType> dtypes, bool compare = false, double lo = -3, double hi = 3) {
  return [=](std::mt19937& rng) {
    for (DType d : dtypes)
      for (const auto& [sa, sb] : kBinaryShapes) {
        Host a = random_host(sa, d, rng, lo, hi), b = random_host(sb, d, rng, lo, hi);
        if (compare) {  // small integers so that equal values actually occur
          for (double& v : a.v) v = std::floor(v);
          for (double& v : b.v) v = std::floor(v);
        }
        const DType od = compare ? DType::kBool : d;
        const Host want = ref_map({&a, &b}, od, [&](const auto& v) { return f(v[0], v[1]); });
        expect_close(run(record(op, {to_tensor(a), to_tensor(b)})), want, tol_for(od),
                     fmt::format("{} {} {} {}", op_name(op), dtype_name(d), shape_str(sa), shape_str(sb)));
      }
  };
}

const std::vector<DType> kFloat = {DType::kF32, DType::kF64, DType::kBF16};
const std::vector<DType> kNumeric = {DType::kF32, DType::kF64, DType::kI32, DType::kI64};
const std::vector<DType> kAll = {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64};

// Reduction reference over `axes` (sorted) with keepdim.
Host ref_reduce(const Host& x, const std::vector<int64_t>& axes, bool keepdim, Op op) {
  Shape out_shape, kept;
  for (int64_t d = 0; d < static_cast<int64_t>(x.shape.size()); ++d) {
    const bool r = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!r) out_shape.push_back(x.shape[d]);
    if (!r || keepdim) kept.push_back(r ? 1 : x.shape[d]);
  }
  const int64_t n_out = numel(out_shape);
  std::vector<double> acc(n_out, op == Op::kMax || op == Op::kArgmax ? -INFINITY : op == Op::kMin ? INFINITY : 0);
  std::vector<int64_t> count(n_out, 0), arg(n_out, 0);
  for (int64_t i = 0; i < numel(x.shape); ++i) {
    std::vector<int64_t> c = coords_of(i, x.shape), oc;
    for (size_t d = 0; d < c.size(); ++d)
      if (std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) == axes.end()) oc.push_back(c[d]);
    const int64_t o = flat_of(oc, out_shape);
    const double v = x.v[i];
    if (op == Op::kMax || op == Op::kArgmax) {
      if (v > acc[o]) acc[o] = v, arg[o] = c[axes[0]];
    } else if (op == Op::kMin) {
      acc[o] = std::min(acc[o], v);
    } else {
      acc[o] += v;
    }
    ++count[o];
  }
  Host out{keepdim ? kept : out_shape, op == Op::kArgmax ? DType::kI64 : x.dtype, {}};
  for (int64_t o = 0; o < n_out; ++o) {
    double v = op == Op::kArgmax ? static_cast<double>(arg[o]) : op == Op::kMean ? acc[o] / count[o] : acc[o];
    if (op == Op::kMean && count[o] == 0) v = NAN;
    out.v.push_back(round_to(v, out.dtype));
  }
  return out;
}

Case reduction(Op op, std::vector<DType> dtypes) {
  return [=](std::mt19937& rng) {
    const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
        {{4, 5, 6}, {}}, {{4, 5, 6}, {0}}, {{4, 5, 6}, {1}}, {{4, 5, 6}, {2}}, {{4, 5, 6}, {0, 2}},
        {{4, 5, 6}, {1, 2}}, {{7}, {0}}, {{3, 1, 9}, {1}}, {{0, 3}, {0}}, {{2, 0, 3}, {2}}};
    for (DType d : dtypes)
      for (const auto& [s, axes] : cases)
        for (bool keep : {false, true}) {
          if ((op == Op::kMax || op == Op::kMin) && numel(s) == 0) continue;  // rejected, tested below
          const Host x = random_host(s, d, rng);
          std::vector<int64_t> all = axes;
          if (all.empty()) for (size_t i = 0; i < s.size(); ++i) all.push_back(static_cast<int64_t>(i));
          const Host want = ref_reduce(x, all, keep, op);
          Tol t = tol_for(d);
          if (d == DType::kF32) t = {1e-5, 1e-5};
          expect_close(run(record(op, {to_tensor(x)}, Attrs{all, 0, DType::kF32, keep})), want, t,
                       fmt::format("{} {}{} axes {} keep {}", op_name(op), dtype_name(d), shape_str(s), all.size(), keep));
        }
  };
}

std::map<Op, Case> make_cases();

TEST(Conformance, EveryOpInTheListMatchesTheReference) {
  ScopedRuntime rt;
  const std::map<Op, Case> cases = make_cases();
  std::mt19937 rng(1234);
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    auto it = cases.find(op);
    if (it == cases.end()) {
      ADD_FAILURE() << "op '" << op_name(op) << "' has no conformance case";
      continue;
    }
    SCOPED_TRACE(std::string(op_name(op)));
    it->second(rng);
  }
  EXPECT_EQ(rt->live_tensors(), 0u);
}

}  // namespace

// Layout, linear algebra, indexing and random cases live in conformance_cases.cpp.
void add_structural_cases(std::map<Op, std::function<void(std::mt19937&)>>& cases);
void expect_close_public(const Host& got, const Host& want, double rtol, double atol, const std::string& what) {
  expect_close(got, want, {rtol, atol}, what);
}
Host run_public(const Tensor& t) { return run(t); }

namespace {

std::map<Op, Case> make_cases() {
  using std::exp;
  std::map<Op, Case> c;
  c[Op::kNeg] = unary(Op::kNeg, [](double x) { return -x; }, kAll);
  c[Op::kAbs] = unary(Op::kAbs, [](double x) { return std::abs(x); }, kAll);
  c[Op::kSign] = unary(Op::kSign, [](double x) { return (x > 0) - (x < 0); }, kAll);
  c[Op::kSquare] = unary(Op::kSquare, [](double x) { return x * x; }, kAll);
  c[Op::kRelu] = unary(Op::kRelu, [](double x) { return x > 0 ? x : 0; }, kAll);
  c[Op::kExp] = unary(Op::kExp, [](double x) { return std::exp(x); }, kFloat);
  c[Op::kLog] = unary(Op::kLog, [](double x) { return std::log(x); }, kFloat, 0.01, 5);
  c[Op::kSqrt] = unary(Op::kSqrt, [](double x) { return std::sqrt(x); }, kFloat, 0, 5);
  c[Op::kRsqrt] = unary(Op::kRsqrt, [](double x) { return 1 / std::sqrt(x); }, kFloat, 0.05, 5);
  c[Op::kReciprocal] = unary(Op::kReciprocal, [](double x) { return 1 / x; }, kFloat, 0.1, 3);
  c[Op::kTanh] = unary(Op::kTanh, [](double x) { return std::tanh(x); }, kFloat);
  c[Op::kSigmoid] = unary(Op::kSigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }, kFloat);
  c[Op::kGelu] = unary(Op::kGelu, [](double x) { return 0.5 * x * (1 + std::erf(x / std::numbers::sqrt2)); }, kFloat);
  c[Op::kSin] = unary(Op::kSin, [](double x) { return std::sin(x); }, kFloat);
  c[Op::kErf] = unary(Op::kErf, [](double x) { return std::erf(x); }, kFloat);
  c[Op::kCos] = unary(Op::kCos, [](double x) { return std::cos(x); }, kFloat);
  c[Op::kLogicalNot] = unary(Op::kLogicalNot, [](double x) { return x == 0; }, {DType::kBool});
  c[Op::kAdd] = binary(Op::kAdd, [](double x, double y) { return x + y; }, kAll);
  c[Op::kSub] = binary(Op::kSub, [](double x, double y) { return x - y; }, kAll);
  c[Op::kMul] = binary(Op::kMul, [](double x, double y) { return x * y; }, kAll);
  c[Op::kDiv] = binary(Op::kDiv, [](double x, double y) { return x / y; }, kFloat, false, 0.5, 3);
  c[Op::kMaximum] = binary(Op::kMaximum, [](double x, double y) { return std::max(x, y); }, kAll);
  c[Op::kMinimum] = binary(Op::kMinimum, [](double x, double y) { return std::min(x, y); }, kAll);
  c[Op::kPow] = binary(Op::kPow, [](double x, double y) { return std::pow(x, y); }, kFloat, false, 0.2, 2);
  c[Op::kEq] = binary(Op::kEq, [](double x, double y) { return x == y; }, kAll, true);
  c[Op::kNe] = binary(Op::kNe, [](double x, double y) { return x != y; }, kAll, true);
  c[Op::kLt] = binary(Op::kLt, [](double x, double y) { return x < y; }, kAll, true);
  c[Op::kLe] = binary(Op::kLe, [](double x, double y) { return x <= y; }, kAll, true);
  c[Op::kGt] = binary(Op::kGt, [](double x, double y) { return x > y; }, kAll, true);
  c[Op::kGe] = binary(Op::kGe, [](double x, double y) { return x >= y; }, kAll, true);
  c[Op::kLogicalAnd] = binary(Op::kLogicalAnd, [](double x, double y) { return x && y; }, {DType::kBool});
  c[Op::kLogicalOr] = binary(Op::kLogicalOr, [](double x, double y) { return x || y; }, {DType::kBool});
  c[Op::kSum] = reduction(Op::kSum, {DType::kF32, DType::kF64, DType::kI32, DType::kI64, DType::kBF16});
  c[Op::kMean] = reduction(Op::kMean, kFloat);
  c[Op::kMax] = reduction(Op::kMax, kAll);
  c[Op::kMin] = reduction(Op::kMin, kAll);
  c[Op::kArgmax] = [](std::mt19937& rng) {
    for (const auto& [s, axis] : std::vector<std::pair<Shape, int64_t>>{{{4, 7}, 1}, {{4, 7}, 0}, {{3, 4, 5}, 1}, {{9}, 0}})
      for (bool keep : {false, true}) {
        const Host x = random_host(s, DType::kF32, rng);
        expect_close(run(argmax(to_tensor(x), axis, keep)), ref_reduce(x, {axis}, keep, Op::kArgmax), {0, 0},
                     fmt::format("argmax {} axis {}", shape_str(s), axis));
      }
  };
  add_structural_cases(c);
  return c;
}

}  // namespace
}  // namespace xs::testing
