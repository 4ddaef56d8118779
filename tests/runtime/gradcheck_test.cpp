// Acceptance 1 of the autograd issue: every op with a gradient rule in runtime/ops.def, checked
// in f64 against central finite differences on random shapes (with broadcasting where the op
// broadcasts). The walk over the op list fails for a rule without a case here.
#include <cmath>
#include <functional>
#include <map>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

using Rng = std::mt19937;
using Inputs = std::vector<Tensor>;

// Inputs are f64 tensors of `shapes` with values in [lo, hi], kept at least `gap` from zero
// (so kinks such as relu/abs at 0 are never straddled by the finite difference).
struct Case {
  std::vector<Shape> shapes;
  std::function<Tensor(const Inputs&)> f;
  double lo = -1, hi = 1, gap = 0.05;
};

int64_t dim(Rng& rng, int64_t lo = 1, int64_t hi = 4) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Through a pointer an op's defaulted SourceLoc must be passed: this line is the site.
Case unary(Rng& rng, Tensor (*op)(const Tensor&, SourceLoc), double lo = -1, double hi = 1) {
  return {{{dim(rng), dim(rng)}}, [op](const Inputs& x) { return op(x[0], SourceLoc::current()); }, lo, hi};
}

// Broadcasting operand shapes: {a, 1, c} with {b, 1}, or equal shapes.
std::vector<Shape> binary_shapes(Rng& rng) {
  const int64_t a = dim(rng), b = dim(rng, 2), c = dim(rng, 2);
  if (rng() % 2 == 0) return {{a, 1, c}, {b, 1}};
  return {{a, b}, {a, b}};
}

Case binary(Rng& rng, Tensor (*op)(const Tensor&, const Tensor&, SourceLoc), double lo = -1, double hi = 1) {
  return {binary_shapes(rng), [op](const Inputs& x) { return op(x[0], x[1], SourceLoc::current()); }, lo, hi};
}

Tensor index_tensor(const Shape& shape, int64_t range, uint32_t seed) {
  Rng rng(seed);
  std::vector<int64_t> v(numel(shape));
  for (int64_t& i : v) i = static_cast<int64_t>(rng() % range);
  return Tensor::from_vector<int64_t>(v, shape);
}

Case reduce_case(Rng& rng, Tensor (*op)(const Tensor&, std::vector<int64_t>, bool, SourceLoc)) {
  const bool keep = rng() % 2 == 0;
  const int64_t axis = static_cast<int64_t>(rng() % 3);
  return {{{dim(rng), dim(rng, 2), dim(rng)}},
          [=](const Inputs& x) { return op(x[0], {axis}, keep, SourceLoc::current()); }};
}

Case matmul_case(Rng& rng) {
  const int64_t m = dim(rng), k = dim(rng), n = dim(rng);
  const bool ta = rng() % 2, tb = rng() % 2;
  Shape a = ta ? Shape{k, m} : Shape{m, k};
  Shape b = tb ? Shape{n, k} : Shape{k, n};
  a.insert(a.begin(), 2);  // batch dim broadcast against b's missing one
  return {{a, b}, [=](const Inputs& x) { return matmul(x[0], x[1], ta, tb); }};
}

std::map<Op, Case> cases(Rng& rng) {
  std::map<Op, Case> c;
  c[Op::kNeg] = unary(rng, neg);
  c[Op::kAbs] = unary(rng, abs);
  c[Op::kSign] = unary(rng, sign);
  c[Op::kSquare] = unary(rng, square);
  c[Op::kRelu] = unary(rng, relu);
  c[Op::kExp] = unary(rng, exp);
  c[Op::kLog] = unary(rng, log, 0.5, 2);
  c[Op::kSqrt] = unary(rng, sqrt, 0.5, 2);
  c[Op::kRsqrt] = unary(rng, rsqrt, 0.5, 2);
  c[Op::kReciprocal] = unary(rng, reciprocal, 0.5, 2);
  c[Op::kTanh] = unary(rng, tanh, -2, 2);
  c[Op::kSigmoid] = unary(rng, sigmoid, -3, 3);
  c[Op::kGelu] = unary(rng, gelu, -3, 3);
  c[Op::kErf] = unary(rng, erf, -2, 2);
  c[Op::kSin] = unary(rng, sin, -3, 3);
  c[Op::kCos] = unary(rng, cos, -3, 3);
  c[Op::kAdd] = binary(rng, add);
  c[Op::kSub] = binary(rng, sub);
  c[Op::kMul] = binary(rng, mul);
  c[Op::kDiv] = binary(rng, div, 0.5, 2);
  c[Op::kMaximum] = binary(rng, maximum);
  c[Op::kMinimum] = binary(rng, minimum);
  c[Op::kPow] = binary(rng, pow, 0.5, 2);
  c[Op::kWhere] = {binary_shapes(rng),
                   [](const Inputs& x) { return where(gt(x[0], x[1] * 0.3), x[0], x[1]); }};
  c[Op::kCast] = unary(rng, [](const Tensor& x, SourceLoc loc) { return cast(x, DType::kF64, loc); });
  c[Op::kSum] = reduce_case(rng, sum);
  c[Op::kMean] = reduce_case(rng, mean);
  c[Op::kMax] = reduce_case(rng, max);
  c[Op::kMin] = reduce_case(rng, min);
  c[Op::kReshape] = {{{2, 3, 2}}, [](const Inputs& x) { return reshape(x[0], {3, -1}); }};
  c[Op::kPermute] = {{{2, 3, 4}}, [](const Inputs& x) { return permute(x[0], {2, 0, 1}); }};
  c[Op::kSlice] = {{{5, 7}},
                   [](const Inputs& x) { return slice(slice(x[0], 1, 1, 7, 3), 0, 1, 4); }};
  c[Op::kConcat] = {{{2, 3}, {2, 1}, {2, 2}}, [](const Inputs& x) {
                      return concat({x[0], x[1], x[2]}, 1);
                    }};
  c[Op::kBroadcast] = {{{3, 1}}, [](const Inputs& x) { return broadcast_to(x[0], {2, 3, 4}); }};
  c[Op::kPad] = {{{2, 3}}, [](const Inputs& x) { return pad(x[0], {1, 0, 2, 1}, 0.5); }};
  c[Op::kMatmul] = matmul_case(rng);
  const int64_t stride = dim(rng, 1, 2), padding = dim(rng, 0, 1);
  c[Op::kConv2d] = {{{2, 2, 5, 5}, {3, 2, 3, 3}}, [=](const Inputs& x) {
                      return conv2d(x[0], x[1], {stride, stride}, {padding, padding});
                    }};
  // Padded and unpadded windows take different kernel paths: the seeds cover both.
  const int64_t pool_pad = static_cast<int64_t>(rng() % 2);
  c[Op::kMaxPool2d] = {{{2, 2, 4, 5}}, [=](const Inputs& x) {
                         return max_pool2d(x[0], {2, 2}, {2, 1}, {pool_pad, 0});
                       }};
  c[Op::kAvgPool2d] = {{{2, 2, 4, 5}}, [=](const Inputs& x) {
                         return avg_pool2d(x[0], {3, 2}, {1, 2}, {pool_pad, 0});
                       }};
  c[Op::kGather] = {{{4, 3}}, [](const Inputs& x) {
                      return gather(x[0], 0, index_tensor({2, 3}, 4, 7));
                    }};
  c[Op::kScatterAdd] = {{{5, 3}}, [](const Inputs& x) {
                          return scatter_add(index_tensor({5, 3}, 2, 9), x[0], 0, {2, 3});
                        }};
  // Repeated rows in the index: their gradients must add up in the table.
  c[Op::kEmbedding] = {{{5, 3}}, [](const Inputs& x) {
                         return embedding(x[0], index_tensor({2, 4}, 5, 11));
                       }};
  c[Op::kEmbeddingGrad] = {{{2, 4, 3}}, [](const Inputs& x) {
                             return embedding_grad(index_tensor({2, 4}, 5, 13), x[0], 5);
                           }};
  // gamma and beta are random too, so all three gradients are checked away from 1 and 0.
  c[Op::kLayerNorm] = {{{2, 3, 5}, {5}, {5}}, [](const Inputs& x) {
                         return layer_norm(x[0], x[1], x[2], 1e-5);
                       }};
  // Plain and causal (the masked half must get no gradient and pass none on).
  const bool causal = rng() % 2 == 0;
  c[Op::kSoftmax] = {{{2, 4, 4}}, [causal](const Inputs& x) {
                       return causal ? causal_softmax(x[0]) : softmax(x[0], -1);
                     }};
  c[Op::kAllReduce] = unary(rng, [](const Tensor& x, SourceLoc loc) { return all_reduce(x, ReduceOp::kSum, loc); });
  return c;
}

std::vector<std::vector<double>> random_values(const Case& c, Rng& rng) {
  std::uniform_real_distribution<double> u(c.lo, c.hi);
  std::vector<std::vector<double>> values;
  for (const Shape& s : c.shapes) {
    std::vector<double> v(numel(s));
    for (double& x : v) {
      do x = u(rng);
      while (std::abs(x) < c.gap);
    }
    values.push_back(std::move(v));
  }
  return values;
}

// loss = sum(f(inputs) * weights): every output element contributes with its own weight.
Tensor loss_of(const Case& c, const std::vector<std::vector<double>>& values, Inputs& inputs,
               bool track) {
  inputs.clear();
  for (size_t i = 0; i < values.size(); ++i) {
    inputs.push_back(Tensor::from_vector<double>(values[i], c.shapes[i]));
    if (track) inputs.back().set_requires_grad(true);
  }
  const Tensor out = c.f(inputs);
  std::vector<double> w(out.numel());
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5 + 0.25 * static_cast<double>(i % 5);
  return sum(out * Tensor::from_vector<double>(w, out.shape()));
}

void check_case(Op op, const Case& c, Rng& rng) {
  SCOPED_TRACE(fmt::format("op {}", op_name(op)));
  std::vector<std::vector<double>> values = random_values(c, rng);
  Inputs inputs;
  backward(loss_of(c, values, inputs, true));
  const double eps = 1e-6;
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_TRUE(inputs[i].grad().defined()) << "input " << i << " got no gradient";
    const std::vector<double> analytic = inputs[i].grad().to_vector<double>();
    for (size_t j = 0; j < values[i].size(); ++j) {
      NoGradGuard no_grad;
      Inputs scratch;
      const double x = values[i][j];
      values[i][j] = x + eps;
      const double up = loss_of(c, values, scratch, false).item();
      values[i][j] = x - eps;
      const double down = loss_of(c, values, scratch, false).item();
      values[i][j] = x;
      const double numeric = (up - down) / (2 * eps);
      ASSERT_NEAR(analytic[j], numeric, 1e-6 * (1 + std::abs(numeric)))
          << "input " << i << " element " << j;
    }
  }
}

TEST(GradCheck, EveryOpWithAGradientRuleMatchesFiniteDifferencesInF64) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    ScopedRuntime rt;
    Rng rng(seed);
    const std::map<Op, Case> all = cases(rng);
    for (int i = 0; i < kNumOps; ++i) {
      const Op op = static_cast<Op>(i);
      if (grad_rule(op) == nullptr) continue;
      auto it = all.find(op);
      ASSERT_NE(it, all.end()) << "op '" << op_name(op)
                               << "' has a gradient rule but no gradient check case";
      check_case(op, it->second, rng);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(GradCheck, DifferentiatingThroughAnOpWithoutARuleNamesTheOp) {
  ScopedRuntime rt;
  Tensor g = Tensor::full_data({1, 1, 3, 3}, 0.5).set_requires_grad(true);
  const Tensor w = Tensor::full_data({1, 1, 2, 2}, 0.25);
  const Tensor y = conv2d_grad_input(g, w, {1, 1}, {0, 0}, {4, 4});
  try {
    backward(sum(y));
    FAIL() << "backward through conv2d_grad_input did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'conv2d_grad_input' has no gradient rule"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace xs
