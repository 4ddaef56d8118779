// Mixed precision under autocast (AutocastGuard): which ops run in bf16 and which in f32, that
// results stay within bf16's tolerance of the f32 run, that parameters (the optimizer's master
// weights) and their gradients stay f32, the f32 -> bf16 rounding of the cast, and the state
// dict's f32 <-> bf16 conversion. XLA_SPAWN_USE_BF16 is read once per process: use_bf16_test.cpp.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/optimizer_step.h"
#include "xla_spawn/runtime/autocast.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/loss.h"
#include "xla_spawn/runtime/nn/conv2d.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/optim/sgd.h"
#include "xla_spawn/runtime/runtime.h"
#include "xla_spawn/runtime/state_dict.h"

namespace xs {
namespace {

std::vector<float> ramp(int64_t n, float scale, float phase = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i) + phase);
  return v;
}

// Largest |a - b| relative to the largest |b| (bf16 keeps 8 significant bits: 2^-8 = 0.4 %).
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return worst / scale;
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

TEST(Autocast, MatmulRunsInBF16AndStaysWithinItsToleranceOfF32) {
  ScopedRuntime rt;
  const Tensor a = Tensor::from_vector<float>(ramp(7 * 33, 1.5f), {7, 33});
  const Tensor b = Tensor::from_vector<float>(ramp(33 * 5, 0.8f, 1), {33, 5});
  // The f32 product of the operands rounded to bf16: autocast's product is that, accumulated in
  // f32 and rounded once (half an ulp of bf16: 2^-9 relative), up to the order of the sums.
  const auto rounded = [](const Tensor& t) { return cast(cast(t, DType::kBF16), DType::kF32); };
  const std::vector<float> want = matmul(rounded(a), rounded(b)).to_vector<float>();
  Tensor got;
  {
    AutocastGuard bf16(DType::kBF16);
    got = matmul(a, b);
  }
  EXPECT_EQ(got.dtype(), DType::kBF16);
  const std::vector<float> g = got.to_vector<float>();
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(g[i], want[i], std::abs(want[i]) * 0x1p-8 + 1e-5) << "element " << i;
  EXPECT_LT(relative_error(g, matmul(a, b).to_vector<float>()), 3e-2);  // and near the f32 one
}

TEST(Autocast, SumsSoftmaxAndLossesRunInF32) {
  ScopedRuntime rt;
  const Tensor x = Tensor::from_vector<float>(ramp(4 * 6, 3), {4, 6});
  AutocastGuard bf16(DType::kBF16);
  const Tensor h = matmul(x, Tensor::from_vector<float>(ramp(36, 1), {6, 6}));
  ASSERT_EQ(h.dtype(), DType::kBF16);
  EXPECT_EQ(sum(h).dtype(), DType::kF32);
  EXPECT_EQ(mean(h, {1}).dtype(), DType::kF32);
  EXPECT_EQ(softmax(h, 1).dtype(), DType::kF32);
  EXPECT_EQ(exp(h).dtype(), DType::kF32);
  EXPECT_EQ(log(relu(h) + 1.0).dtype(), DType::kF32);
  EXPECT_EQ(rsqrt(relu(h) + 1.0).dtype(), DType::kF32);
  EXPECT_EQ(log_softmax(h, 1).dtype(), DType::kF32);
  EXPECT_EQ(logsumexp(h, 1).dtype(), DType::kF32);
  EXPECT_EQ(cross_entropy(h, Tensor::from_vector<int64_t>({0, 5, 2, 3}, {4})).dtype(), DType::kF32);
  EXPECT_EQ(relu(h).dtype(), DType::kBF16);  // elementwise ops keep their operands' dtype
}

TEST(Autocast, MixedFloatOperandsAreWidenedInsideAutocastAndRefusedOutside) {
  ScopedRuntime rt;
  const Tensor f = Tensor::from_vector<float>({1.0f, 2.0f}, {2});
  const Tensor h = cast(f, DType::kBF16);
  EXPECT_THROW((void)(h + f), InvalidArgument);
  AutocastGuard bf16(DType::kBF16);
  const Tensor s = h + f;
  EXPECT_EQ(s.dtype(), DType::kF32);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{2, 4}));
}

TEST(Autocast, TheGuardNestsRestoresAndRefusesOtherDtypes) {
  EXPECT_FALSE(autocast_dtype().has_value());
  {
    AutocastGuard on(DType::kBF16);
    EXPECT_EQ(autocast_dtype(), DType::kBF16);
    {
      AutocastGuard off(DType::kF32);
      EXPECT_FALSE(autocast_dtype().has_value());
    }
    EXPECT_EQ(autocast_dtype(), DType::kBF16);
  }
  EXPECT_FALSE(autocast_dtype().has_value());
  EXPECT_THROW(AutocastGuard(DType::kF64), InvalidArgument);
}

// A Linear layer's forward under autocast and its backward outside: the output is bf16, the
// parameters and their gradients f32, the gradients within bf16's tolerance of the f32 run's.
TEST(Autocast, LinearGradientsComeBackAsF32ForTheMasterWeights) {
  ScopedRuntime rt;
  const Tensor x = Tensor::from_vector<float>(ramp(8 * 20, 1), {8, 20});
  const Tensor labels = Tensor::from_vector<int64_t>({0, 1, 2, 0, 1, 2, 0, 1}, {8});
  std::vector<std::vector<float>> grads[2];
  for (int bf16 : {0, 1}) {
    Generator gen(3);
    Linear fc(20, 3, gen);
    Tensor loss;
    {
      AutocastGuard autocast(bf16 ? DType::kBF16 : DType::kF32);
      const Tensor y = fc(x);
      EXPECT_EQ(y.dtype(), bf16 ? DType::kBF16 : DType::kF32);
      loss = cross_entropy(y, labels);
    }
    backward(loss);
    for (const Tensor& p : fc.parameters()) {
      EXPECT_EQ(p.dtype(), DType::kF32);
      EXPECT_EQ(p.grad().dtype(), DType::kF32);
      grads[bf16].push_back(p.grad().to_vector<float>());
    }
  }
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_LT(relative_error(grads[1][i], grads[0][i]), 3e-2) << "parameter " << i;
}

TEST(Autocast, Conv2dRunsInBF16WithItsBiasAndGivesF32Gradients) {
  ScopedRuntime rt;
  const Tensor x = Tensor::from_vector<float>(ramp(2 * 3 * 9 * 9, 1), {2, 3, 9, 9});
  std::vector<float> outs[2];
  std::vector<float> weight_grads[2];
  for (int bf16 : {0, 1}) {
    Generator gen(5);
    Conv2d conv(3, 4, 3, gen, 1, 1);
    Tensor y;
    {
      AutocastGuard autocast(bf16 ? DType::kBF16 : DType::kF32);
      y = conv(x);
    }
    EXPECT_EQ(y.dtype(), bf16 ? DType::kBF16 : DType::kF32);
    backward(sum(square(cast(y, DType::kF32))));
    outs[bf16] = y.to_vector<float>();
    const Tensor w = conv.parameters()[0];
    EXPECT_EQ(w.grad().dtype(), DType::kF32);
    weight_grads[bf16] = w.grad().to_vector<float>();
  }
  EXPECT_LT(relative_error(outs[1], outs[0]), 1.5e-2);
  EXPECT_LT(relative_error(weight_grads[1], weight_grads[0]), 3e-2);
}

// A convolution of fewer than 3 input channels stays f32 (faster there, and fused with its
// bias, relu and pooling); a bf16 input is widened for it.
TEST(Autocast, ANarrowConvolutionStaysF32) {
  ScopedRuntime rt;
  Generator gen(5);
  Conv2d conv(1, 4, 3, gen, 1, 1);
  const Tensor x = Tensor::from_vector<float>(ramp(2 * 9 * 9, 1), {2, 1, 9, 9});
  AutocastGuard bf16(DType::kBF16);
  EXPECT_EQ(conv(x).dtype(), DType::kF32);
  EXPECT_EQ(conv(cast(x, DType::kBF16)).dtype(), DType::kF32);
}

// The update runs on the f32 master weights: after a few steps under autocast they hold values
// bf16 cannot represent, which they could not if the update had been rounded to bf16.
TEST(Autocast, OptimizerMasterWeightsStayF32) {
  ScopedRuntime rt;
  Generator gen(11);
  Linear fc(16, 4, gen);
  SGD opt(fc.parameters(), SgdOptions{.lr = 1e-3, .momentum = 0.9});
  const Tensor x = Tensor::from_vector<float>(ramp(6 * 16, 1), {6, 16});
  const Tensor labels = Tensor::from_vector<int64_t>({0, 1, 2, 3, 0, 1}, {6});
  for (int step = 0; step < 3; ++step) {
    Tensor loss;
    {
      AutocastGuard bf16(DType::kBF16);
      loss = cross_entropy(fc(x), labels);
    }
    backward(loss);
    opt.apply(opt.gradients());
    opt.zero_grad();
    mark_step();
  }
  int64_t not_bf16 = 0;
  for (const Tensor& p : fc.parameters()) {
    ASSERT_EQ(p.dtype(), DType::kF32);
    for (float v : p.to_vector<float>()) not_bf16 += (bits(v) & 0xffffu) != 0;
  }
  EXPECT_GT(not_bf16, 0);
}

TEST(Autocast, AutocastGradientsAreExchangedAsTheirBF16Values) {
  ScopedRuntime rt;
  Generator gen(2);
  Linear fc(12, 3, gen);
  Tensor extra = Tensor::from_vector<float>(ramp(3, 1), {3}).set_requires_grad(true);
  Tensor loss;
  {
    AutocastGuard bf16(DType::kBF16);
    loss = sum(fc(Tensor::from_vector<float>(ramp(24, 1), {2, 12}))) + sum(extra * extra);
  }
  backward(loss);
  const std::vector<Tensor> grads = {fc.parameters()[0].grad(), fc.parameters()[1].grad(),
                                     extra.grad()};
  const std::vector<Tensor> sent = xm::exchanged_gradients(grads);
  for (const Tensor& g : sent) EXPECT_EQ(g.dtype(), DType::kBF16);
  // The bf16 value loses nothing (its f32 cast is the gradient); the f32 parameter's gradient
  // (used in f32 under autocast: `extra * extra` kept its dtype) is rounded once.
  EXPECT_EQ(cast(sent[0], DType::kF32).to_vector<float>(), grads[0].to_vector<float>());
  EXPECT_EQ(sent[2].to_vector<BF16>()[1].bits,
            BF16::from_float(grads[2].to_vector<float>()[1]).bits);
  // Without autocast nothing changes.
  Tensor plain = Tensor::from_vector<float>(ramp(3, 1), {3}).set_requires_grad(true);
  backward(sum(plain * plain));
  EXPECT_EQ(xm::exchanged_gradients({plain.grad()})[0].dtype(), DType::kF32);
}

// The cast op rounds f32 to bf16 to nearest, ties to even, keeps NaN a NaN and overflows to
// infinity, as BF16::from_float does; through the runtime (generated code and interpreter).
TEST(BF16Rounding, TheCastRoundsToNearestEvenKeepsNaNAndOverflowsToInfinity) {
  ScopedRuntime rt;
  const float max_f32 = std::numeric_limits<float>::max();
  const std::vector<float> in = {
      from_bits(0x3f808000u),  // 1 + 2^-8: halfway between 1 and 1 + 2^-7, ties to even (down)
      from_bits(0x3f818000u),  // halfway, odd below: ties to even (up)
      from_bits(0x3f808001u),  // just above halfway: up
      from_bits(0x3f807fffu),  // just below halfway: down
      -from_bits(0x3f818000u),
      std::numeric_limits<float>::quiet_NaN(),
      from_bits(0x7f800001u),  // a signalling NaN's payload in the low bits only
      max_f32,                 // rounds past bf16's largest finite: infinity
      -max_f32,
      std::numeric_limits<float>::infinity(),
      from_bits(0x00000001u),  // the smallest subnormal: to +0
      0.0f,
      -0.0f};
  const std::vector<uint16_t> want = {0x3f80, 0x3f82, 0x3f81, 0x3f80, 0xbf82, 0, 0,
                                      0x7f80, 0xff80, 0x7f80, 0x0000, 0x0000, 0x8000};
  // x * 1 keeps the cast inside a fused loop (generated code when codegen is on).
  const Tensor x = Tensor::from_vector<float>(in, {static_cast<int64_t>(in.size())});
  const std::vector<BF16> got = cast(x * 1.0, DType::kBF16).to_vector<BF16>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::isnan(in[i])) {
      EXPECT_TRUE(std::isnan(got[i].to_float())) << "element " << i;
      EXPECT_EQ(got[i].bits & 0x8000u, bits(in[i]) >> 16 & 0x8000u) << "element " << i;
    } else {
      EXPECT_EQ(got[i].bits, want[i]) << "element " << i << " = " << in[i];
    }
    EXPECT_EQ(BF16::from_float(in[i]).bits, got[i].bits) << "element " << i;
  }
}

TEST(BF16StateDict, F32AndBF16EntriesLoadIntoEitherDtype) {
  ScopedRuntime rt;
  const std::vector<float> v = {1.0f, from_bits(0x3f818000u), -2.5f};
  Tensor f32 = Tensor::from_vector<float>(v, {3});
  Tensor bf16 = Tensor::from_vector<float>({0, 0, 0}, {3}, DType::kBF16);
  const StateDict from_f32 = to_state_dict({{"t", f32}});
  load_state_dict({{"t", bf16}}, from_f32);
  EXPECT_EQ(bf16.dtype(), DType::kBF16);
  EXPECT_EQ(bf16.to_vector<float>(), (std::vector<float>{1.0f, from_bits(0x3f820000u), -2.5f}));
  Tensor back = Tensor::from_vector<float>({0, 0, 0}, {3});
  load_state_dict({{"t", back}}, to_state_dict({{"t", bf16}}));
  EXPECT_EQ(back.dtype(), DType::kF32);
  EXPECT_EQ(back.to_vector<float>(), bf16.to_vector<float>());
  Tensor f64 = Tensor::from_vector<double>({0, 0, 0}, {3});
  EXPECT_THROW(load_state_dict({{"t", f64}}, from_f32), InvalidArgument);
}

}  // namespace
}  // namespace xs
