// Losses against host references: cross-entropy (stable for large logits, weighted/masked with
// a tensor divisor) and MSE, values and gradients.
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/loss.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

double ref_nll(const std::vector<double>& row, int label) {
  double m = row[0];
  for (double v : row) m = std::max(m, v);
  double s = 0;
  for (double v : row) s += std::exp(v - m);
  return -(row[label] - m - std::log(s));
}

TEST(Loss, CrossEntropyMatchesReferenceAndItsGradientIsSoftmaxMinusOneHot) {
  ScopedRuntime rt;
  const std::vector<float> v = {1, 2, 3, -1, 0.5, 4};
  Tensor logits = Tensor::from_vector<float>(v, {2, 3}).set_requires_grad(true);
  const Tensor labels = Tensor::from_vector<int64_t>({2, 0}, {2});
  const Tensor loss = cross_entropy(logits, labels);
  const double want = (ref_nll({1, 2, 3}, 2) + ref_nll({-1, 0.5, 4}, 0)) / 2;
  EXPECT_NEAR(loss.item(), want, 1e-6);
  backward(loss);
  const std::vector<float> g = logits.grad().to_vector<float>();
  const double s0 = std::exp(1) + std::exp(2) + std::exp(3);
  EXPECT_NEAR(g[0], std::exp(1) / s0 / 2, 1e-6);
  EXPECT_NEAR(g[2], (std::exp(3) / s0 - 1) / 2, 1e-6);
}

TEST(Loss, CrossEntropyIsFiniteForHugeLogits) {
  ScopedRuntime rt;
  const Tensor logits = Tensor::from_vector<float>({1000, -1000, 0, 3000}, {2, 2});
  const Tensor labels = Tensor::from_vector<int32_t>({1, 1}, {2}, DType::kI32);
  const double l = cross_entropy(logits, labels).item();
  EXPECT_TRUE(std::isfinite(l));
  EXPECT_NEAR(l, 1000, 1e-3);  // sample 0: 2000 nats; sample 1: 0
}

// x - logsumexp(x) cancelled in f32 for large logits (1.54254 for the first row, 0 for the
// second), and one_hot * log_softmax made a logit masked with -inf a NaN loss (0 * -inf).
TEST(Loss, CrossEntropyKeepsItsDigitsForLargeLogitsAndTakesMinusInfinityLogits) {
  ScopedRuntime rt;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<std::vector<float>, int>> rows = {
      {{1000, 1000.1f, 1000.2f, 1000.3f}, 0}, {{1e8f, 1e8f, 1e8f, 1e8f}, 1},
      {{3e38f, 3e38f, -3e38f, 0}, 0}, {{-inf, 0, 1, 2}, 3}};
  for (const auto& [row, label] : rows) {
    Tensor logits = Tensor::from_vector<float>(row, {1, 4}).set_requires_grad(true);
    const Tensor loss = cross_entropy(logits, Tensor::from_vector<int64_t>({label}, {1}));
    backward(loss);
    const std::vector<double> exact(row.begin(), row.end());
    EXPECT_NEAR(loss.item(), ref_nll(exact, label), 2e-6) << row[0];
    for (float g : logits.grad().to_vector<float>()) EXPECT_TRUE(std::isfinite(g)) << row[0];
  }
}

TEST(Loss, WeightedCrossEntropyMasksPaddedSamplesWithATensorDivisor) {
  ScopedRuntime rt;
  const Tensor logits = Tensor::from_vector<float>({1, 2, 3, -1, 0.5, 4, 9, 9, 9}, {3, 3});
  const Tensor labels = Tensor::from_vector<int64_t>({2, 0, 1}, {3});
  const Tensor mask = Tensor::from_vector<float>({1, 1, 0}, {3});
  const double got = cross_entropy(logits, labels, mask, Tensor::full_data({}, 2)).item();
  EXPECT_NEAR(got, (ref_nll({1, 2, 3}, 2) + ref_nll({-1, 0.5, 4}, 0)) / 2, 1e-6);
  EXPECT_THROW(cross_entropy(logits, labels, mask, mask), InvalidArgument);
}

TEST(Loss, MseIsTheMeanSquaredErrorWithGradientTwoDiffOverN) {
  ScopedRuntime rt;
  Tensor p = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}).set_requires_grad(true);
  const Tensor t = Tensor::from_vector<float>({0, 2, 5, 4}, {2, 2});
  const Tensor loss = mse_loss(p, t);
  EXPECT_NEAR(loss.item(), (1 + 0 + 4 + 0) / 4.0, 1e-6);
  backward(loss);
  EXPECT_EQ(p.grad().to_vector<float>(), (std::vector<float>{0.5, 0, -1, 0}));
}

}  // namespace
}  // namespace xs
