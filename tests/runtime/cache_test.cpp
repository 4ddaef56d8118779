// Acceptance 2 (cache): compile counts across steps, the LRU, and what does and does not
// change a graph's hash.
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"
#include "tests/support/scoped_env.h"

namespace xs {
namespace {

// One SGD-like step on a tiny linear model: the new weight replaces the old one.
void sgd_step(Tensor& w, const Tensor& x, double lr) {
  const Tensor y = matmul(x, w);
  const Tensor grad = matmul(x, y, /*transpose_a=*/true);
  w.assign(w - grad * lr);
}

Tensor random_matrix(int64_t rows, int64_t cols, float scale = 0.1f) {
  std::vector<float> v(rows * cols);
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>((i * 7919) % 13) / 13.0f;
  return Tensor::from_vector<float>(v, {rows, cols});
}

TEST(CompileCache, TenIdenticalStepsCompileOnceAndHitNineTimes) {
  ScopedRuntime rt;
  Tensor w = random_matrix(8, 4);
  const Tensor x = random_matrix(16, 8);
  for (int step = 0; step < 10; ++step) {
    sgd_step(w, x, 0.01);
    mark_step();
  }
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 1);
  EXPECT_EQ(rt->metrics().counter(kCounterCachedCompile), 9);
  EXPECT_EQ(rt->metrics().counter(kCounterMarkStep), 10);
  EXPECT_EQ(rt->metrics().timer(kTimerExecuteTime).count, 10);
}

TEST(CompileCache, ChangedLearningRateDoesNotRecompile) {
  ScopedRuntime rt;
  Tensor w = random_matrix(8, 4);
  const Tensor x = random_matrix(16, 8);
  for (double lr : {0.1, 0.05, 0.025, 0.3}) {
    sgd_step(w, x, lr);
    mark_step();
  }
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 1);
  EXPECT_EQ(rt->metrics().counter(kCounterCachedCompile), 3);
}

TEST(CompileCache, ChangedBatchSizeCompilesExactlyOnceMore) {
  ScopedRuntime rt;
  Tensor w = random_matrix(8, 4);
  const Tensor x16 = random_matrix(16, 8), x32 = random_matrix(32, 8);
  for (int step = 0; step < 3; ++step) sgd_step(w, x16, 0.01), mark_step();
  for (int step = 0; step < 3; ++step) sgd_step(w, x32, 0.01), mark_step();
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 2);
  EXPECT_EQ(rt->metrics().counter(kCounterCachedCompile), 4);
}

TEST(CompileCache, NewRandomSeedDoesNotRecompile) {
  ScopedRuntime rt;
  const Tensor x = random_matrix(4, 4);
  std::vector<float> first;
  for (int step = 0; step < 3; ++step) {
    Tensor y = x * bernoulli({4, 4}, 0.5);
    mark_step();
    if (step == 0) first = y.to_vector<float>();
    else EXPECT_NE(y.to_vector<float>(), first) << "a new seed must give a new mask";
  }
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 1);
}

TEST(CompileCache, DifferentConstantValueIsADifferentGraph) {
  ScopedRuntime rt;
  const Tensor x = random_matrix(4, 4);
  Tensor a = x * 1.0;  // constant 1: folded away
  mark_step();
  Tensor b = x * 3.0;  // data scalar
  mark_step();
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 2);
}

TEST(CompileCache, MomentumStepWithHostFilledStateCompilesOnce) {
  ScopedRuntime rt;
  Tensor w = random_matrix(8, 4), velocity = Tensor::full_data({8, 4}, 0);
  const Tensor x = random_matrix(16, 8), one = Tensor::ones({});  // a held constant stays one
  for (int step = 0; step < 5; ++step) {
    const Tensor grad = matmul(x, matmul(x, w), true);
    velocity.assign(velocity * 0.9 + grad * one);
    w.assign(w - velocity * 0.01);
    mark_step();
  }
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 1);
  EXPECT_EQ(rt->metrics().counter(kCounterCachedCompile), 4);
  EXPECT_TRUE(one.is_pending());
}

TEST(CompileCache, LruEvictsLeastRecentlyUsedAtCapacityFromEnv) {
  testing::ScopedEnv env("XLA_SPAWN_COMPILE_CACHE_SIZE", "2");
  ScopedRuntime rt;
  EXPECT_EQ(rt->cache().capacity(), 2u);
  const Tensor x = random_matrix(4, 4);
  auto step = [&](int kind) {
    Tensor y = kind == 0 ? exp(x) : kind == 1 ? tanh(x) : sqrt(x);
    mark_step();
  };
  step(0), step(1), step(0), step(2);  // 2 evicts 1 (0 was used more recently)
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 3);
  step(0);
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 3);
  step(1);
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 4);
}

TEST(CompileCache, BadCacheSizeInEnvIsRejectedWithTheVariableName) {
  testing::ScopedEnv env("XLA_SPAWN_COMPILE_CACHE_SIZE", "zero");
  try {
    ScopedRuntime rt;
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("XLA_SPAWN_COMPILE_CACHE_SIZE"), std::string::npos) << e.what();
  }
}

TEST(CompileCache, HostReadSyncsOnlyWhatItNeedsAndCountsOutsideGraph) {
  ScopedRuntime rt;
  const Tensor x = random_matrix(4, 4);
  Tensor a = exp(x), b = tanh(x);
  EXPECT_EQ(a.to_vector<float>().size(), 16u);
  EXPECT_FALSE(a.is_pending());
  EXPECT_TRUE(b.is_pending());
  EXPECT_EQ(rt->metrics().counter(kCounterOpsOutsideGraph), 1);
  EXPECT_EQ(rt->metrics().counter(kCounterMarkStep), 0);
  EXPECT_EQ(rt->metrics().counter(kCounterTransferFromDevice), 1);
}

}  // namespace
}  // namespace xs

namespace xs {
namespace {

uint64_t hash_of(const std::vector<Tensor>& roots, bool donation = false) {
  std::vector<NodePtr> nodes;
  for (const Tensor& t : roots) nodes.push_back(t.ir());
  return cut_graph(nodes, donation).hash;
}

TEST(GraphHash, DependsOnStructureNotOnValues) {
  ScopedRuntime rt;
  const Tensor a = Tensor::from_vector<float>({1, 2}, {2}), b = Tensor::from_vector<float>({3, 4}, {2});
  EXPECT_EQ(hash_of({exp(a) + 1.5}), hash_of({exp(b) + 7.0}));  // other data, other scalar
  EXPECT_EQ(make_data(a.buffer(), a.type())->hash, make_data(b.buffer(), b.type())->hash);
  EXPECT_NE(hash_of({exp(a)}), hash_of({tanh(a)}));
  EXPECT_NE(hash_of({a + 1.0}), hash_of({a + 0.0}));  // 0 and 1 are constants
}

TEST(GraphHash, DistinguishesSharedFromDistinctInputs) {
  ScopedRuntime rt;
  const Tensor a = Tensor::from_vector<float>({1, 2}, {2}), b = Tensor::from_vector<float>({3, 4}, {2});
  EXPECT_NE(hash_of({a + a}), hash_of({a + b}));
  EXPECT_NE(hash_of({a + b, a}), hash_of({a + b, b}));  // root order matters
}

TEST(GraphHash, IncludesDonation) {
  ScopedRuntime rt;
  Tensor w = Tensor::from_vector<float>({1, 2}, {2});
  const uint64_t held = hash_of({w * 2.0}, true);
  const Tensor update = w * 2.0;
  w = Tensor();  // nothing holds the old buffer but the IR now
  EXPECT_NE(hash_of({update}, true), held);
}

}  // namespace
}  // namespace xs
