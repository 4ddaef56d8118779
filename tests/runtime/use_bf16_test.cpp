// XLA_SPAWN_USE_BF16=1 (PyTorch/XLA's XLA_USE_BF16): every f32 tensor the program makes is bf16
// on the device, host reads give f32 values, state dicts hold f32 and f32 entries load. The
// variable is read once per process, so CTest runs this binary with it set (tests/runtime/
// CMakeLists.txt); run by hand without it, every test is skipped with a message.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "xla_spawn/runtime/autocast.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/loss.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/optim/adam.h"
#include "xla_spawn/runtime/optim/sgd.h"
#include "xla_spawn/runtime/runtime.h"
#include "xla_spawn/runtime/state_dict.h"
#include "tests/support/captured_log.h"

namespace xs {
namespace {

class UseBF16 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!use_bf16()) GTEST_SKIP() << "needs XLA_SPAWN_USE_BF16=1 in the environment (CTest sets it)";
  }
  ScopedRuntime rt_;
};

TEST_F(UseBF16, F32TensorsAreBF16OnTheDeviceAndReadBackAsF32) {
  const Tensor x = Tensor::from_vector<float>({1.0f, 1.00390625f, 3.0f}, {3});
  EXPECT_EQ(x.dtype(), DType::kBF16);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1.0f, 1.0f, 3.0f}));  // 1 + 2^-8 ties to 1
  EXPECT_EQ(Tensor::full({2}, 0.5).dtype(), DType::kBF16);
  EXPECT_EQ(Tensor::zeros({2}).dtype(), DType::kBF16);
  EXPECT_EQ(Tensor::full_data({2}, 3.0).dtype(), DType::kBF16);
  EXPECT_EQ(cast(Tensor::from_vector<int64_t>({1, 2}, {2}), DType::kF32).dtype(), DType::kBF16);
  EXPECT_EQ(sum(x * x).item(), 11.0);
  EXPECT_EQ(Tensor::from_vector<double>({1.0}, {1}).dtype(), DType::kF64);  // f64 stays f64
}

TEST_F(UseBF16, AnF32BufferMadeOutsideThePolicyIsCastOnFirstUse) {
  BufferPtr buf = Buffer::allocate(2 * sizeof(float));
  const float v[2] = {2.0f, -1.0f};
  std::memcpy(buf->data(), v, sizeof v);
  const Tensor loaded = Tensor::from_buffer(buf, {{1, 2}, DType::kF32});  // as a data loader does
  const Tensor w = Tensor::from_vector<float>({1.0f, 1.0f}, {2, 1});
  const Tensor y = matmul(loaded, w);
  EXPECT_EQ(y.dtype(), DType::kBF16);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1.0f}));
}

TEST_F(UseBF16, StateDictsHoldF32AndF32EntriesLoad) {
  Tensor t = Tensor::from_vector<float>({0.5f, 2.0f}, {2});
  const StateDict sd = to_state_dict({{"t", t}});
  ASSERT_EQ(sd.size(), 1u);
  EXPECT_EQ(sd[0].dtype, DType::kF32);
  HostTensorData f32{"t", DType::kF32, {2}, {}};
  const float v[2] = {4.0f, 1.00390625f};
  f32.bytes.resize(sizeof v);
  std::memcpy(f32.bytes.data(), v, sizeof v);
  load_state_dict({{"t", t}}, {f32});
  EXPECT_EQ(t.dtype(), DType::kBF16);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{4.0f, 1.0f}));
}

TEST_F(UseBF16, ALinearLayerTrainsInBF16) {
  Generator gen(1);
  Linear fc(8, 3, gen);
  SGD opt(fc.parameters(), SgdOptions{.lr = 0.5});
  std::vector<float> xs(4 * 8);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i % 5) - 2.0f;
  const Tensor x = Tensor::from_vector<float>(xs, {4, 8});
  const Tensor labels = Tensor::from_vector<int64_t>({0, 1, 2, 0}, {4});
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    const Tensor loss = cross_entropy(fc(x), labels);
    EXPECT_EQ(loss.dtype(), DType::kBF16);
    backward(loss);
    opt.apply(opt.gradients());
    opt.zero_grad();
    mark_step();
    (step == 0 ? first : last) = loss.item();
  }
  for (const Tensor& p : fc.parameters()) EXPECT_EQ(p.dtype(), DType::kBF16);
  EXPECT_LT(last, first * 0.5);
}

// Adam's state is bf16 here; a state dict of it holds f32 and loads back.
TEST_F(UseBF16, OptimizerStateRoundTripsThroughAnF32StateDict) {
  Generator gen(4);
  Linear fc(6, 2, gen);
  Adam opt(fc.parameters(), AdamOptions{.lr = 0.01, .beta2 = 0.99});
  const Tensor x = Tensor::from_vector<float>(std::vector<float>(12, 0.5f), {2, 6});
  backward(sum(fc(x)));
  opt.apply(opt.gradients());
  opt.zero_grad();
  mark_step();
  const StateDict saved = to_state_dict(opt.named_state());
  for (const HostTensorData& e : saved) EXPECT_NE(e.dtype, DType::kBF16) << e.name;
  Adam fresh(fc.parameters(), AdamOptions{.lr = 0.01, .beta2 = 0.99});
  fresh.load_state(to_tensors(saved));
  const NamedTensors a = opt.named_state(), b = fresh.named_state();
  for (size_t i = 1; i < a.size(); ++i) {
    EXPECT_EQ(b[i].second.dtype(), DType::kBF16);
    EXPECT_EQ(a[i].second.to_vector<float>(), b[i].second.to_vector<float>()) << a[i].first;
  }
}

// bf16 cannot hold beta2 = 0.999 or AdamW's decay factor 1 - 1e-5: Adam says so; 0.99 it can.
TEST_F(UseBF16, AdamWarnsWhenBf16LosesItsConstants) {
  Generator gen(4);
  Linear fc(2, 2, gen);
  {
    testing::CapturedLog log;
    AdamW lost(fc.parameters(), AdamOptions{.lr = 1e-3, .weight_decay = 0.01});
    EXPECT_NE(log.text().find("round to (0.8984375, 1) in bf16"), std::string::npos) << log.text();
    EXPECT_NE(log.text().find("decoupled decay does nothing"), std::string::npos) << log.text();
  }
  testing::CapturedLog log;
  Adam kept(fc.parameters(), AdamOptions{.lr = 1e-3, .beta2 = 0.99});
  EXPECT_EQ(log.text(), "");
}

// A uniform draw stays below 1 after rounding to bf16 (draws within 2^-9 of 1 would round up).
TEST_F(UseBF16, UniformDrawsStayBelowOne) {
  const std::vector<float> u = rand_uniform({1 << 16}).to_vector<float>();
  EXPECT_LT(*std::max_element(u.begin(), u.end()), 1.0f);
  EXPECT_GE(*std::min_element(u.begin(), u.end()), 0.0f);
}

}  // namespace
}  // namespace xs
