// Acceptance 2 and 3 of the autograd issue: a 2-layer MLP and a small CNN learn synthetic
// separable problems to a loss threshold in a fixed number of steps, bit-identically when run
// twice with the same seed; a full MLP 784-512-512-10 / SGD-momentum step (and the CNN's)
// compiles once and is then only looked up.
#include <cstring>
#include <memory>

#include <gtest/gtest.h>

#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/loss.h"
#include "xla_spawn/runtime/nn/activation.h"
#include "xla_spawn/runtime/nn/batch_norm.h"
#include "xla_spawn/runtime/nn/conv2d.h"
#include "xla_spawn/runtime/nn/dropout.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/nn/sequential.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/optim/adam.h"
#include "xla_spawn/runtime/optim/sgd.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

struct Batch {
  Tensor x, labels;
};

// Four Gaussian-ish blobs in 16-d: class k is centred on +-2 along axes k and k+4.
Batch blobs(int64_t n, uint64_t seed) {
  Generator gen(seed);
  std::vector<float> x(n * 16);
  std::vector<int64_t> y(n);
  for (int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<int64_t>(gen.next_u64() % 4);
    for (int64_t d = 0; d < 16; ++d) x[i * 16 + d] = static_cast<float>(gen.uniform(-1, 1));
    x[i * 16 + y[i]] += 2;
    x[i * 16 + y[i] + 4] -= 2;
  }
  return {Tensor::from_vector<float>(x, {n, 16}), Tensor::from_vector<int64_t>(y, {n})};
}

// 1x8x8 noise images with a bright 3x3 patch in the quadrant given by the class.
Batch patches(int64_t n, uint64_t seed) {
  Generator gen(seed);
  std::vector<float> x(n * 64);
  std::vector<int64_t> y(n);
  for (int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<int64_t>(gen.next_u64() % 4);
    for (int64_t p = 0; p < 64; ++p) x[i * 64 + p] = static_cast<float>(gen.uniform(0, 0.5));
    const int64_t r0 = (y[i] / 2) * 4 + 1, c0 = (y[i] % 2) * 4 + 1;
    for (int64_t r = r0; r < r0 + 3; ++r)
      for (int64_t c = c0; c < c0 + 3; ++c) x[i * 64 + r * 8 + c] += 1;
  }
  return {Tensor::from_vector<float>(x, {n, 1, 8, 8}), Tensor::from_vector<int64_t>(y, {n})};
}

struct Result {
  double loss;
  std::vector<std::vector<float>> weights;
};

Result train(Module& model, Optimizer& opt, const Batch& data, int steps) {
  Tensor loss;
  for (int s = 0; s < steps; ++s) {
    loss = cross_entropy(model(data.x), data.labels);
    backward(loss);
    opt.step();
    opt.zero_grad();
    mark_step();
  }
  Result r{loss.item(), {}};
  for (const Tensor& p : model.parameters()) r.weights.push_back(p.to_vector<float>());
  return r;
}

Result train_mlp(uint64_t seed) {
  ScopedRuntime rt;
  Generator gen(seed);
  Sequential mlp({std::make_shared<Linear>(16, 32, gen), std::make_shared<ReLU>(),
                  std::make_shared<Linear>(32, 4, gen)});
  SGD opt(mlp.parameters(), {.lr = 0.1, .momentum = 0.9});
  return train(mlp, opt, blobs(256, seed + 1), 60);
}

Result train_cnn(uint64_t seed) {
  ScopedRuntime rt;
  Generator gen(seed);
  Sequential cnn({std::make_shared<Conv2d>(1, 4, 3, gen, 1, 1), std::make_shared<ReLU>(),
                  std::make_shared<MaxPool2d>(2), std::make_shared<Flatten>(),
                  std::make_shared<Linear>(64, 4, gen)});
  Adam opt(cnn.parameters(), {.lr = 0.02});
  return train(cnn, opt, patches(128, seed + 1), 60);
}

TEST(Training, TwoLayerMlpLearnsSeparableBlobsAndRepeatsBitForBit) {
  const Result a = train_mlp(5), b = train_mlp(5);
  EXPECT_LT(a.loss, 0.05);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_NE(a.weights, train_mlp(6).weights);
}

TEST(Training, SmallCnnLearnsPatchPositionsAndRepeatsBitForBit) {
  const Result a = train_cnn(11), b = train_cnn(11);
  EXPECT_LT(a.loss, 0.1);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.weights, b.weights);
}

void expect_compiles_once(Module& model, Optimizer& opt, const Batch& data) {
  for (int s = 0; s < 3; ++s) {
    Tensor loss = cross_entropy(model(data.x), data.labels);
    backward(loss);
    opt.step();
    opt.zero_grad();
    mark_step();
  }
  EXPECT_EQ(runtime().metrics().counter(kCounterUncachedCompile), 1);
  EXPECT_EQ(runtime().metrics().counter(kCounterCachedCompile), 2);
  EXPECT_EQ(runtime().metrics().counter(kCounterOpsOutsideGraph), 0);
}

Batch zeros_batch(Shape shape) {
  const int64_t n = shape[0];
  return {Tensor::full_data(shape, 0.25), Tensor::full_data({n}, 3, DType::kI64)};
}

TEST(Training, MlpStep784x512x512x10WithSgdMomentumCompilesOnce) {
  ScopedRuntime rt;
  Generator gen(0);
  Sequential mlp({std::make_shared<Linear>(784, 512, gen), std::make_shared<ReLU>(),
                  std::make_shared<Linear>(512, 512, gen), std::make_shared<ReLU>(),
                  std::make_shared<Linear>(512, 10, gen)});
  SGD opt(mlp.parameters(), {.lr = 0.01, .momentum = 0.9});
  expect_compiles_once(mlp, opt, zeros_batch({128, 784}));
}

TEST(Training, CnnStepCompilesOnce) {
  ScopedRuntime rt;
  Generator gen(0);
  Sequential cnn({std::make_shared<Conv2d>(1, 8, 5, gen, 1, 2), std::make_shared<ReLU>(),
                  std::make_shared<MaxPool2d>(2), std::make_shared<Conv2d>(8, 16, 5, gen, 1, 2),
                  std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2),
                  std::make_shared<Flatten>(), std::make_shared<Linear>(16 * 7 * 7, 32, gen),
                  std::make_shared<ReLU>(), std::make_shared<Linear>(32, 10, gen)});
  SGD opt(cnn.parameters(), {.lr = 0.01, .momentum = 0.9});
  expect_compiles_once(cnn, opt, zeros_batch({16, 1, 28, 28}));
}

// BatchNorm's running statistics and Dropout's fresh masks are in-graph state and data: a step
// with both still compiles once, and the model still learns.
TEST(Training, CnnWithBatchNormAndDropoutLearnsAndCompilesOnce) {
  ScopedRuntime rt;
  Generator gen(4);
  Sequential cnn({std::make_shared<Conv2d>(1, 4, 3, gen, 1, 1), std::make_shared<BatchNorm2d>(4),
                  std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2),
                  std::make_shared<Flatten>(), std::make_shared<Dropout>(0.1),
                  std::make_shared<Linear>(64, 4, gen)});
  Adam opt(cnn.parameters(), {.lr = 0.02});
  const Batch data = patches(128, 5);
  const Result r = train(cnn, opt, data, 60);
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 1);
  cnn.eval();
  const double eval_loss = cross_entropy(cnn(data.x), data.labels).item();
  EXPECT_LT(eval_loss, 0.2) << "training loss " << r.loss;
  auto* bn = dynamic_cast<BatchNorm2d*>(&cnn.at(1));
  ASSERT_NE(bn, nullptr);
  EXPECT_NE(bn->running_mean().to_vector<float>(), std::vector<float>(4, 0.0f));
}

}  // namespace
}  // namespace xs
