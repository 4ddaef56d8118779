// Property test for the compiler: random DAGs of elementwise, broadcast, reduction and
// matmul ops give the same values when the whole DAG is one optimised program (fusion,
// epilogues, absorbed loops, in-place reuse, donation) and when every op runs on its own.
#include <cmath>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

constexpr int64_t kRows = 6, kCols = 5;

Tensor random_input(const Shape& shape, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  std::vector<float> v(numel(shape));
  for (float& x : v) x = u(rng);
  return Tensor::from_vector<float>(v, shape);
}

// One random op over values of shape [kRows, kCols]; `eager` forces it at once.
Tensor random_op(std::vector<Tensor>& pool, std::mt19937& rng, bool eager, const std::vector<int>& choice, size_t& at) {
  auto pick = [&] { return pool[choice[at++] % pool.size()]; };
  const int kind = choice[at++] % 10;
  const Tensor a = pick(), b = pick(), c = pick();  // in sequence: argument order is unspecified
  Tensor out;
  switch (kind) {
    case 0: out = a + b; break;
    case 1: out = a * b; break;
    case 2: out = relu(a - 0.25); break;
    case 3: out = tanh(a) * 0.5; break;
    case 4: out = a + sum(b, {0}, true); break;  // row broadcast
    case 5: out = a - max(b, {1}, true); break;  // column broadcast
    case 6: out = matmul(matmul(a, transpose(b, 0, 1)) * 0.1, c); break;
    case 7: out = where(gt(a, b), c, Tensor::scalar(0)); break;
    case 8: out = cast(cast(a, DType::kF64) * 2.0, DType::kF32); break;
    default: out = sqrt(abs(a) + 1.0); break;
  }
  (void)rng;
  if (eager) out.to_vector<float>();
  return out;
}

class FusionProperty : public ::testing::TestWithParam<int> {};

TEST_P(FusionProperty, OneProgramMatchesOpByOp) {
  ScopedRuntime rt;
  std::mt19937 rng(GetParam());
  std::vector<int> choice(600);
  for (int& c : choice) c = static_cast<int>(rng() % 1000);
  std::vector<Tensor> inputs;
  for (int i = 0; i < 3; ++i) inputs.push_back(random_input({kRows, kCols}, rng));

  auto run = [&](bool eager) {
    std::vector<Tensor> pool = inputs;
    size_t at = 0;
    for (int i = 0; i < 40; ++i) pool.push_back(random_op(pool, rng, eager, choice, at));
    mark_step();
    std::vector<std::vector<float>> values;
    for (const Tensor& t : pool) values.push_back(t.to_vector<float>());
    return values;
  };
  const auto eager = run(true);
  const auto fused = run(false);
  EXPECT_GT(rt->last_stats().fused_ops + rt->last_stats().matmul_epilogues, 0);
  ASSERT_EQ(eager.size(), fused.size());
  for (size_t t = 0; t < eager.size(); ++t)
    for (size_t i = 0; i < eager[t].size(); ++i) {
      const float e = eager[t][i], f = fused[t][i];
      ASSERT_NEAR(f, e, 1e-5f * (1 + std::abs(e))) << "value " << t << " element " << i;
    }
}

INSTANTIATE_TEST_SUITE_P(Seeds, FusionProperty, ::testing::Range(1, 25));

}  // namespace
}  // namespace xs
