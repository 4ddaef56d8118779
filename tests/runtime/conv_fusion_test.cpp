// The compiler's conv-layer fusions (compiler/passes.h): the ReLU mask moved to the pooled side
// of the max-pool gradient, the bias gradient summed over the pooled gradient, and pooling
// moved before bias and ReLU. The fused programs touch no activation-sized loop and give the
// same values as the unfused ops run one graph at a time.
#include <algorithm>
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/compiler/compile.h"
#include "xla_spawn/runtime/program.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

// Values on a coarse grid (many ties inside pooling windows) around 0 (many windows clipped
// to 0 by the ReLU).
Tensor grid(const Shape& shape, int salt) {
  std::vector<float> v(numel(shape));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = 0.25f * static_cast<float>(static_cast<int>((i * 7 + salt) % 13) - 6);
  return Tensor::from_vector<float>(v, shape);
}

std::shared_ptr<Program> compile_roots(const std::vector<Tensor>& roots) {
  std::vector<NodePtr> nodes;
  for (const Tensor& t : roots) nodes.push_back(t.ir());
  return compile_graph(cut_graph(nodes, /*allow_donation=*/false));
}

// A copy of `t`'s value as a fresh data tensor: later graphs see a leaf, not its IR.
Tensor materialised(const Tensor& t) {
  return Tensor::from_vector<float>(t.to_vector<float>(), t.shape());
}

struct PoolCase {
  int64_t kernel, stride, padding, hw;
};

class ConvFusion : public ::testing::TestWithParam<PoolCase> {};

TEST_P(ConvFusion, BiasReluPoolAndItsGradientTouchOnlyThePooledSizeAndMatchTheUnfusedOps) {
  ScopedRuntime rt;
  const PoolCase pc = GetParam();
  const Shape xs{3, 4, pc.hw, pc.hw};
  const std::vector<int64_t> k{pc.kernel, pc.kernel}, s{pc.stride, pc.stride},
      p{pc.padding, pc.padding};
  const Tensor x = grid(xs, 1), b = grid({4}, 5);
  const Tensor y = relu(x + reshape(b, {1, 4, 1, 1}));
  const Tensor pooled = max_pool2d(y, k, s, p);
  const Tensor h = grid(pooled.shape(), 3);
  const Tensor dy = max_pool2d_grad(y, h, k, s, p) * cast(gt(y, Tensor::scalar(0)), DType::kF32);
  const Tensor db = sum(dy, {0, 2, 3});

  auto program = compile_roots({pooled, dy, db});
  for (const Kernel& kern : program->kernels) {
    EXPECT_NE(kern.loop.shape, xs) << "an activation-sized loop is left:\n" << program->text();
    if (kern.op == Op::kSum) {
      EXPECT_NE(kern.in_types[0].shape, xs) << program->text();
    }
    if (kern.op == Op::kMaxPool2dGrad) {
      EXPECT_EQ(kern.in_storage.size(), 3u) << program->text();
    }
  }

  // Unfused: every op in its own graph, so no pass sees two of them together.
  const Tensor y_ref = materialised(relu(x + reshape(b, {1, 4, 1, 1})));
  const Tensor pooled_ref = materialised(max_pool2d(y_ref, k, s, p));
  const Tensor routed_ref = materialised(max_pool2d_grad(y_ref, h, k, s, p));
  const Tensor mask_ref = materialised(cast(gt(y_ref, Tensor::scalar(0)), DType::kF32));
  const Tensor dy_ref = materialised(routed_ref * mask_ref);
  const std::vector<float> db_ref = sum(dy_ref, {0, 2, 3}).to_vector<float>();

  EXPECT_EQ(pooled.to_vector<float>(), pooled_ref.to_vector<float>());
  EXPECT_EQ(dy.to_vector<float>(), dy_ref.to_vector<float>());
  const std::vector<float> got = db.to_vector<float>();
  ASSERT_EQ(got.size(), db_ref.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], db_ref[i], 1e-5 * (1 + std::abs(db_ref[i]))) << i;
}

INSTANTIATE_TEST_SUITE_P(Windows, ConvFusion,
                         ::testing::Values(PoolCase{2, 2, 0, 8},    // the usual 2x2 tiling
                                           PoolCase{2, 2, 0, 7},    // odd size: last row unpooled
                                           PoolCase{3, 2, 1, 9},    // overlapping, padded
                                           PoolCase{3, 1, 0, 6}));  // stride 1

TEST(PoolGradFusion, BiasReluPoolGradientMatchesTheGradientOverTheStoredActivation) {
  ScopedRuntime rt;
  const Tensor x = grid({2, 3, 6, 6}, 2), b = grid({3}, 4), g = grid({2, 3, 3, 3}, 6);
  const Tensor y = materialised(relu(x + reshape(b, {1, 3, 1, 1})));
  const std::vector<float> want = max_pool2d_grad(y, g, {2, 2}, {2, 2}).to_vector<float>();
  EXPECT_EQ(max_pool2d_bias_relu_grad(x, b, g, {2, 2}, {2, 2}).to_vector<float>(), want);
  const Tensor g3 = grid({2, 3, 2, 2}, 7);  // 3x3 windows: the generic (materialising) path
  EXPECT_EQ(max_pool2d_bias_relu_grad(x, b, g3, {3, 3}, {3, 3}).to_vector<float>(),
            max_pool2d_grad(y, g3, {3, 3}, {3, 3}).to_vector<float>());
}

TEST(PoolGradFusion, BiasWithTheWrongChannelCountIsRejected) {
  ScopedRuntime rt;
  const Tensor x = grid({2, 3, 4, 4}, 0), g = grid({2, 3, 2, 2}, 0);
  EXPECT_THROW(max_pool2d_bias_relu_grad(x, grid({4}, 0), g, {2, 2}, {2, 2}), InvalidArgument);
}

TEST(PoolGradFusion, ActivationReadElsewhereIsNotPooledFirst) {
  ScopedRuntime rt;
  const Tensor x = grid({2, 3, 4, 4}, 1), b = grid({3}, 2);
  const Tensor y = relu(x + reshape(b, {1, 3, 1, 1}));
  const Tensor pooled = max_pool2d(y, {2, 2}, {2, 2});
  const Tensor also = y * 2.0;  // y itself is needed: it must still be computed at full size
  auto program = compile_roots({pooled, also});
  for (const Kernel& k : program->kernels)  // no bias-and-ReLU loop over the pooled size
    EXPECT_NE(k.loop.shape, (Shape{2, 3, 2, 2})) << program->text();
  const Tensor y_ref = materialised(relu(x + reshape(b, {1, 3, 1, 1})));
  EXPECT_EQ(pooled.to_vector<float>(), max_pool2d(y_ref, {2, 2}, {2, 2}).to_vector<float>());
}

}  // namespace
}  // namespace xs
