// Autograd behaviour beyond single-op rules: accumulation, no_grad, detach, reuse of a value
// on several paths, released records, and that a whole forward+backward+update is one graph.
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

Tensor param(std::vector<float> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return Tensor::from_vector<float>(v, {n}).set_requires_grad(true);
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  ScopedRuntime rt;
  Tensor w = param({1, 2, 3});
  backward(sum(w * w));
  backward(sum(w * 3.0));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{5, 7, 9}));
}

TEST(Autograd, AValueUsedOnTwoPathsGetsBothContributions) {
  ScopedRuntime rt;
  Tensor w = param({2});
  const Tensor h = w * 3.0;
  backward(sum(h * h + h));  // d/dw (9w^2 + 3w) = 18w + 3
  EXPECT_FLOAT_EQ(w.grad().item(), 39);
}

TEST(Autograd, NoGradScopeRecordsNothingAndRestoresOnExit) {
  ScopedRuntime rt;
  Tensor w = param({1, 2});
  {
    NoGradGuard g;
    EXPECT_FALSE(grad_enabled());
    EXPECT_FALSE((w * 2.0).requires_grad());
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_TRUE((w * 2.0).requires_grad());
  EXPECT_THROW(backward(sum(detach(w) * 2.0)), InvalidArgument);
}

TEST(Autograd, DetachStopsTheGradientOnThatPath) {
  ScopedRuntime rt;
  Tensor w = param({3});
  backward(sum(w * detach(w)));  // only the direct path: d/dw = detach(w) = 3
  EXPECT_FLOAT_EQ(w.grad().item(), 3);
}

TEST(Autograd, BroadcastOperandGetsGradientSummedOverBroadcastAxes) {
  ScopedRuntime rt;
  Tensor b = Tensor::from_vector<float>({1, 2}, {1, 2}).set_requires_grad(true);
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  backward(sum(x + b));
  EXPECT_EQ(b.grad().shape(), (Shape{1, 2}));
  EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{3, 3}));
}

TEST(Autograd, BackwardOnANonScalarWithoutAGradientIsRejected) {
  ScopedRuntime rt;
  Tensor w = param({1, 2});
  EXPECT_THROW(backward(w * 2.0), InvalidArgument);
  backward(w * 2.0, Tensor::from_vector<float>({1, 10}, {2}));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 20}));
}

TEST(Autograd, SecondBackwardThroughAReleasedRecordSaysSo) {
  ScopedRuntime rt;
  Tensor w = param({1, 2});
  const Tensor loss = sum(exp(w));
  backward(loss);
  try {
    backward(loss);
    FAIL() << "second backward did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("second time"), std::string::npos) << e.what();
  }
}

TEST(Autograd, OnlyFloatingLeavesCanRequireGradients) {
  ScopedRuntime rt;
  Tensor i = Tensor::from_vector<int32_t>({1}, {1});
  EXPECT_THROW(i.set_requires_grad(true), InvalidArgument);
  Tensor w = param({1});
  Tensor y = w * 2.0;
  EXPECT_FALSE(y.is_leaf());
  EXPECT_THROW(y.set_requires_grad(false), InvalidArgument);
}

TEST(Autograd, ForwardBackwardAndUpdateRunAsOneCachedGraph) {
  ScopedRuntime rt;
  Tensor w = Tensor::full_data({4, 3}, 0.1).set_requires_grad(true);
  const Tensor x = Tensor::full_data({2, 4}, 1.0);
  for (int step = 0; step < 3; ++step) {
    Tensor loss = sum(square(matmul(x, w)));
    backward(loss);
    {
      NoGradGuard g;
      w.assign(w - w.grad() * 0.01);
    }
    w.set_grad({});
    mark_step();
    EXPECT_FALSE(loss.is_pending());
  }
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 1);
  EXPECT_EQ(rt->metrics().counter(kCounterCachedCompile), 2);
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
}

}  // namespace
}  // namespace xs

namespace xs {
namespace {

// The 2x2/stride-2 max pool has its own forward and gradient kernels: both against a host
// reference (gradient at each window's maximum, 0 elsewhere).
TEST(Autograd, MaxPool2x2GradientGoesToEachWindowsMaximum) {
  ScopedRuntime rt;
  const int64_t h = 4, w = 6;
  std::vector<float> v(2 * h * w);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 37) % 23) - 11.0f;
  Tensor x = Tensor::from_vector<float>(v, {1, 2, h, w}).set_requires_grad(true);
  const Tensor y = max_pool2d(x, {2, 2}, {2, 2});
  backward(sum(y * 2.0));
  const std::vector<float> got = y.to_vector<float>(), gx = x.grad().to_vector<float>();
  std::vector<float> want_g(v.size(), 0);
  for (int64_t pl = 0; pl < 2; ++pl)
    for (int64_t oy = 0; oy < h / 2; ++oy)
      for (int64_t ox = 0; ox < w / 2; ++ox) {
        int64_t best = (pl * h + 2 * oy) * w + 2 * ox;
        for (int64_t i = 0; i < 2; ++i)
          for (int64_t j = 0; j < 2; ++j) {
            const int64_t at = (pl * h + 2 * oy + i) * w + 2 * ox + j;
            if (v[at] > v[best]) best = at;
          }
        EXPECT_EQ(got[(pl * (h / 2) + oy) * (w / 2) + ox], v[best]);
        want_g[best] = 2;
      }
  EXPECT_EQ(gx, want_g);
}

}  // namespace
}  // namespace xs
