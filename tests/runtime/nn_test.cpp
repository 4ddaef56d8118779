// Layers: parameter names and shapes, PyTorch's default initialisation bounds, determinism of
// the seeded generator, and the train/eval behaviour of Dropout and BatchNorm2d.
#include <cmath>

#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/nn/activation.h"
#include "xla_spawn/runtime/nn/batch_norm.h"
#include "xla_spawn/runtime/nn/conv2d.h"
#include "xla_spawn/runtime/nn/dropout.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/nn/sequential.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

TEST(Generator, SameSeedSameSequenceAndUniformStaysInRange) {
  Generator a(7), b(7), c(8);
  for (int i = 0; i < 1000; ++i) {
    const double x = a.uniform(-2, 3);
    EXPECT_EQ(x, b.uniform(-2, 3));
    EXPECT_GE(x, -2);
    EXPECT_LT(x, 3);
  }
  EXPECT_NE(a.next_u64(), c.next_u64());
}

TEST(Modules, SequentialNamesParametersLikePyTorch) {
  ScopedRuntime rt;
  Generator gen(0);
  Sequential net({std::make_shared<Conv2d>(1, 4, 3, gen), std::make_shared<ReLU>(),
                  std::make_shared<MaxPool2d>(2), std::make_shared<Flatten>(),
                  std::make_shared<Linear>(36, 10, gen, false)});
  const NamedTensors params = net.named_parameters();
  ASSERT_EQ(params.size(), 3u);
  EXPECT_EQ(params[0].first, "0.weight");
  EXPECT_EQ(params[0].second.shape(), (Shape{4, 1, 3, 3}));
  EXPECT_EQ(params[1].first, "0.bias");
  EXPECT_EQ(params[2].first, "4.weight");
  EXPECT_EQ(params[2].second.shape(), (Shape{10, 36}));
  for (const auto& [name, p] : params) EXPECT_TRUE(p.requires_grad() && p.is_leaf()) << name;
  const Tensor y = net(Tensor::full_data({2, 1, 8, 8}, 0.5));
  EXPECT_EQ(y.shape(), (Shape{2, 10}));
}

TEST(Modules, DefaultInitIsKaimingUniformWithBiasWithinOneOverSqrtFanIn) {
  ScopedRuntime rt;
  Generator gen(3);
  Linear fc(400, 50, gen);
  const double bound = 1 / std::sqrt(400.0);  // kaiming_uniform(a=sqrt(5)) gives the same bound
  double max_abs = 0;
  for (float w : fc.weight().to_vector<float>())
    max_abs = std::max(max_abs, std::abs(static_cast<double>(w)));
  EXPECT_LE(max_abs, bound);
  EXPECT_GT(max_abs, 0.95 * bound);  // 20000 draws reach close to the bound
  for (float b : fc.bias()->to_vector<float>()) EXPECT_LE(std::abs(b), bound);
  Generator again(3);
  Linear same(400, 50, again);
  EXPECT_EQ(fc.weight().to_vector<float>(), same.weight().to_vector<float>());
}

TEST(Modules, DropoutScalesKeptValuesAndIsIdentityInEval) {
  ScopedRuntime rt;
  Dropout drop(0.25);
  const Tensor x = Tensor::full_data({4000}, 1.0);
  const std::vector<float> y = drop(x).to_vector<float>();
  int kept = 0;
  for (float v : y) {
    EXPECT_TRUE(v == 0 || std::abs(v - 1 / 0.75) < 1e-6) << v;
    kept += v != 0;
  }
  EXPECT_NEAR(kept / 4000.0, 0.75, 0.04);
  EXPECT_NE(drop(x).to_vector<float>(), y);  // a fresh seed every call
  drop.eval();
  EXPECT_EQ(drop(x).to_vector<float>(), std::vector<float>(4000, 1.0f));
}

TEST(Modules, DropoutDrawsANewMaskEachStepWithoutRecompiling) {
  ScopedRuntime rt;
  Dropout drop(0.5);
  const Tensor x = Tensor::full_data({64}, 1.0);
  std::vector<std::vector<float>> masks;
  for (int i = 0; i < 3; ++i) {
    Tensor y = drop(x);
    mark_step();
    masks.push_back(y.to_vector<float>());
  }
  EXPECT_NE(masks[0], masks[1]);
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 1);
}

TEST(Modules, BatchNormNormalisesInTrainingAndUpdatesRunningStats) {
  ScopedRuntime rt;
  BatchNorm2d bn(2);
  // Channel 0 holds 1..4, channel 1 holds 10, 10, 10, 10 (N = 1, 2x2 spatial).
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 10, 10, 10, 10}, {1, 2, 2, 2});
  const std::vector<float> y = bn(x).to_vector<float>();
  const double sd = std::sqrt(1.25 + 1e-5);
  EXPECT_NEAR(y[0], -1.5 / sd, 1e-5);
  EXPECT_NEAR(y[3], 1.5 / sd, 1e-5);
  EXPECT_NEAR(y[4], 0, 1e-5);
  mark_step();
  const std::vector<float> rm = bn.running_mean().to_vector<float>(),
                           rv = bn.running_var().to_vector<float>();
  EXPECT_NEAR(rm[0], 0.1 * 2.5, 1e-6);
  EXPECT_NEAR(rm[1], 0.1 * 10, 1e-6);
  EXPECT_NEAR(rv[0], 0.9 + 0.1 * (5.0 / 3.0), 1e-6);  // unbiased variance of 1..4
  bn.eval();
  const std::vector<float> e = bn(x).to_vector<float>();
  EXPECT_NEAR(e[0], (1 - rm[0]) / std::sqrt(rv[0] + 1e-5), 1e-5);
}

TEST(Modules, BatchNormRejectsTheWrongChannelCount) {
  ScopedRuntime rt;
  BatchNorm2d bn(3);
  EXPECT_THROW(bn(Tensor::full_data({1, 2, 2, 2}, 1)), InvalidArgument);
}

}  // namespace
}  // namespace xs
