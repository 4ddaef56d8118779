// Optimizers against host re-computations of PyTorch's update rules, schedules, in-graph
// gradient clipping, the gradients/apply split, compile-once across steps (with a changing
// learning rate) and the state dict round trip.
#include <cmath>

#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/flatten.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/optim/adam.h"
#include "xla_spawn/runtime/optim/clip_grad.h"
#include "xla_spawn/runtime/optim/lr_schedule.h"
#include "xla_spawn/runtime/optim/sgd.h"
#include "xla_spawn/runtime/runtime.h"
#include "xla_spawn/runtime/state_dict.h"

namespace xs {
namespace {

// loss = sum(c * w^2 / 2): gradient c * w, so each step's gradient depends on the last update.
const std::vector<double> kC = {1.0, -0.5, 2.0};

Tensor make_param() {
  return Tensor::from_vector<float>({1.0f, 2.0f, -1.5f}, {3}).set_requires_grad(true);
}

void run_steps(Optimizer& opt, Tensor& w, int steps) {
  const Tensor c = Tensor::from_vector<double>(kC, {3}, DType::kF32);
  for (int s = 0; s < steps; ++s) {
    backward(sum(c * square(w) * 0.5));
    opt.step();
    opt.zero_grad();
    mark_step();
  }
}

std::vector<double> host_grad(const std::vector<double>& w) {
  std::vector<double> g(w.size());
  for (size_t i = 0; i < w.size(); ++i) g[i] = kC[i] * w[i];
  return g;
}

void expect_near(const Tensor& t, const std::vector<double>& want) {
  const std::vector<double> got = t.to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << i;
}

TEST(Optim, SgdMomentumNesterovAndWeightDecayFollowPyTorch) {
  ScopedRuntime rt;
  Tensor w = make_param();
  const SgdOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  SGD opt({w}, o);
  run_steps(opt, w, 4);
  std::vector<double> hw = {1.0, 2.0, -1.5}, buf(3, 0);
  for (int s = 0; s < 4; ++s) {
    std::vector<double> g = host_grad(hw);
    for (size_t i = 0; i < 3; ++i) {
      g[i] += o.weight_decay * hw[i];
      buf[i] = o.momentum * buf[i] + g[i];
      hw[i] -= o.lr * (g[i] + o.momentum * buf[i]);
    }
  }
  expect_near(w, hw);
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 1);
}

void check_adam(bool decoupled) {
  ScopedRuntime rt;
  Tensor w = make_param();
  const AdamOptions o{.lr = 0.05, .weight_decay = 0.1};
  Adam opt({w}, o, decoupled);
  run_steps(opt, w, 5);
  std::vector<double> hw = {1.0, 2.0, -1.5}, m(3, 0), v(3, 0);
  for (int t = 1; t <= 5; ++t) {
    std::vector<double> g = host_grad(hw);
    for (size_t i = 0; i < 3; ++i) {
      if (decoupled)
        hw[i] *= 1 - o.lr * o.weight_decay;
      else
        g[i] += o.weight_decay * hw[i];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps;
      hw[i] -= o.lr / (1 - std::pow(o.beta1, t)) * m[i] / denom;
    }
  }
  expect_near(w, hw);
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 1);
}

TEST(Optim, AdamFollowsPyTorchAndCompilesOnce) {
  check_adam(false);
}
TEST(Optim, AdamWDecaysWeightsDecoupledAndCompilesOnce) {
  check_adam(true);
}

TEST(Optim, ChangingLearningRateEveryStepDoesNotRecompile) {
  ScopedRuntime rt;
  Tensor w = make_param();
  SGD opt({w}, {.lr = 1.0, .momentum = 0.5});
  LrScheduler sched(opt, warmup(2, cosine_decay(4)));
  const Tensor c = Tensor::from_vector<double>(kC, {3}, DType::kF32);
  for (int s = 0; s < 6; ++s) {
    backward(sum(c * square(w) * 0.5));
    opt.step();
    opt.zero_grad();
    sched.step();
    mark_step();
  }
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 1);
  EXPECT_EQ(rt->metrics().counter(kCounterCachedCompile), 5);
}

TEST(Optim, SchedulesFollowStepCosineAndWarmupFormulas) {
  EXPECT_DOUBLE_EQ(step_decay(10, 0.5)(9), 1);
  EXPECT_DOUBLE_EQ(step_decay(10, 0.5)(25), 0.25);
  EXPECT_DOUBLE_EQ(cosine_decay(100)(0), 1);
  EXPECT_NEAR(cosine_decay(100)(50), 0.5, 1e-12);
  EXPECT_NEAR(cosine_decay(100, 0.1)(100), 0.1, 1e-12);
  EXPECT_NEAR(cosine_decay(100, 0.1)(500), 0.1, 1e-12);
  const LrFactor f = warmup(3, step_decay(2, 0.1));
  EXPECT_DOUBLE_EQ(f(0), 0.25);
  EXPECT_DOUBLE_EQ(f(2), 0.75);
  EXPECT_DOUBLE_EQ(f(3), 1);
  EXPECT_NEAR(f(5), 0.1, 1e-12);
}

TEST(Optim, ClipGradNormScalesInGraphOnlyAboveTheLimit) {
  ScopedRuntime rt;
  Tensor a = Tensor::from_vector<float>({3, 0}, {2}).set_requires_grad(true);
  Tensor b = Tensor::from_vector<float>({0, 4}, {2}).set_requires_grad(true);
  backward(sum(a * a * 0.5) + sum(b * b * 0.5));  // gradients a, b: global norm 5
  const Tensor norm = clip_grad_norm({a, b}, 1.0);
  EXPECT_TRUE(norm.is_pending());
  EXPECT_EQ(rt->metrics().counter(kCounterTransferFromDevice), 0);
  mark_step();
  EXPECT_NEAR(norm.item(), 5, 1e-5);
  expect_near(a.grad(), {0.6, 0});
  expect_near(b.grad(), {0, 0.8});
  std::vector<Tensor> small = {Tensor::from_vector<float>({0.3f, 0.4f}, {2})};
  clip_gradients(small, 1.0);
  expect_near(small[0], {0.3, 0.4});
}

TEST(Optim, GradientsCanBeTransformedBetweenGradientsAndApply) {
  ScopedRuntime rt;
  Tensor w = make_param();
  SGD opt({w}, {.lr = 0.5});
  backward(sum(w * 2.0));
  std::vector<Tensor> grads = opt.gradients();
  for (Tensor& g : grads) g = g * 0.5;  // e.g. a mean over two replicas
  opt.apply(grads);
  expect_near(w, {0.5, 1.5, -2.0});
  EXPECT_THROW(opt.apply({}), InvalidArgument);
}

TEST(StateDict, ParametersAndOptimizerStateRoundTripAndResumeIdentically) {
  ScopedRuntime rt;
  Generator gen(1);
  Linear a(3, 2, gen);
  SGD opt_a(a.parameters(), {.lr = 0.1, .momentum = 0.9});
  const Tensor x = Tensor::full_data({4, 3}, 0.7);
  auto train = [&](Linear& m, SGD& opt, int steps) {
    for (int s = 0; s < steps; ++s) {
      backward(sum(square(m(x))));
      opt.step();
      opt.zero_grad();
      mark_step();
    }
  };
  train(a, opt_a, 2);
  const StateDict model_sd = to_state_dict(a.named_state());
  const StateDict opt_sd = to_state_dict(opt_a.named_state());
  ASSERT_EQ(model_sd.size(), 2u);
  EXPECT_EQ(model_sd[0].name, "weight");
  EXPECT_EQ(model_sd[0].shape, (Shape{2, 3}));
  EXPECT_EQ(opt_sd[1].name, "0.momentum_buffer");
  Generator other(99);
  Linear b(3, 2, other);
  SGD opt_b(b.parameters(), {.lr = 0.1, .momentum = 0.9});
  load_state_dict(b.named_state(), model_sd);
  opt_b.load_state(to_tensors(opt_sd));
  EXPECT_EQ(opt_b.steps(), 2);
  train(a, opt_a, 2);
  train(b, opt_b, 2);
  EXPECT_EQ(a.weight().to_vector<float>(), b.weight().to_vector<float>());
  StateDict bad = model_sd;
  bad[0].shape = {3, 2};
  EXPECT_THROW(load_state_dict(b.named_state(), bad), InvalidArgument);
  bad = model_sd;
  bad[1].name = "bais";
  EXPECT_THROW(load_state_dict(b.named_state(), bad), InvalidArgument);
}

}  // namespace
}  // namespace xs

namespace xs {
namespace {

TEST(Flatten, GradientsRoundTripThroughOneFlatBufferInOneGraph) {
  ScopedRuntime rt;
  Generator gen(2);
  Linear fc(3, 2, gen);
  SGD opt(fc.parameters(), {.lr = 0.1});
  backward(sum(square(fc(Tensor::full_data({4, 3}, 0.5)))));
  const std::vector<Tensor> grads = opt.gradients();
  const Tensor flat = flatten_tensors(grads);
  EXPECT_EQ(flat.shape(), (Shape{8}));
  const std::vector<Tensor> back = unflatten_tensors(all_reduce(flat, ReduceOp::kMean), grads);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].shape(), (Shape{2, 3}));
  EXPECT_EQ(back[0].to_vector<float>(), grads[0].to_vector<float>());
  EXPECT_EQ(back[1].to_vector<float>(), grads[1].to_vector<float>());
  EXPECT_THROW(unflatten_tensors(slice(flat, 0, 0, 7), grads), InvalidArgument);
}

}  // namespace
}  // namespace xs
