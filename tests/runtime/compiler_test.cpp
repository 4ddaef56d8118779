// Acceptance 2 (compiler): the passes happened, shown by node and kernel counts, and the
// optimised programs still compute the right values.
#include <algorithm>
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/compiler/compile.h"
#include "xla_spawn/runtime/compiler/passes.h"
#include "xla_spawn/runtime/program.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

Tensor iota(const Shape& shape, float scale = 0.01f) {
  std::vector<float> v(numel(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % 23) - 11);
  return Tensor::from_vector<float>(v, shape);
}

// Compiles the graph of `roots` without running it.
std::shared_ptr<Program> compile_roots(const std::vector<Tensor>& roots) {
  std::vector<NodePtr> nodes;
  for (const Tensor& t : roots) nodes.push_back(t.ir());
  return compile_graph(cut_graph(nodes, /*allow_donation=*/false));
}

TEST(Compiler, CommonSubexpressionsAreMerged) {
  ScopedRuntime rt;
  const Tensor x = iota({4, 8});
  const Tensor y = matmul(x, x, false, true) + matmul(x, x, false, true);  // same matmul twice
  auto p = compile_roots({y});
  EXPECT_EQ(p->stats.nodes_in, 4);  // x, matmul, matmul, add
  EXPECT_EQ(p->stats.cse_merged, 1);
  EXPECT_EQ(p->stats.dce_removed, 1);  // the duplicate, now unused
  EXPECT_EQ(p->stats.nodes_out, 3);
  const std::vector<float> got = y.to_vector<float>();
  const std::vector<float> want = (matmul(x, x, false, true) * 2.0).to_vector<float>();
  EXPECT_EQ(got, want);
}

TEST(Compiler, IdentitiesFoldAndDeadNodesAreRemoved) {
  ScopedRuntime rt;
  const Tensor x = iota({5, 3});
  // (x * 1 + 0) / 1: every op folds away, the root is the input itself.
  const Tensor y = (x * 1.0 + 0.0) / 1.0;
  auto p = compile_roots({y});
  EXPECT_EQ(p->stats.folded, 3);
  EXPECT_EQ(p->stats.nodes_out, 1);  // only x is left
  EXPECT_EQ(p->stats.kernels, 0);
  EXPECT_EQ(y.to_vector<float>(), x.to_vector<float>());
}

TEST(Compiler, ConstantSubgraphsFoldToOneConstant) {
  ScopedRuntime rt;
  const Tensor c = (Tensor::ones({3}) + Tensor::ones({3})) * Tensor::ones({3});  // 2, no data input
  auto p = compile_roots({c});
  EXPECT_EQ(p->stats.nodes_out, 1);
  EXPECT_EQ(p->stats.kernels, 1);  // one fill
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(3, 2.0f));
}

TEST(Compiler, ElementwiseChainFusesIntoOneLoop) {
  ScopedRuntime rt;
  const Tensor x = iota({64, 33}), b = iota({33});
  const Tensor y = tanh(relu(x * 2.5 + b) - 0.5) * x;  // mul, add, relu, sub, tanh, mul
  auto p = compile_roots({y});
  EXPECT_EQ(p->stats.kernels, 1);
  EXPECT_EQ(p->stats.fused_loops, 1);
  EXPECT_EQ(p->stats.fused_ops, 6);
  const std::vector<float> xv = x.to_vector<float>(), bv = b.to_vector<float>(), got = y.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) {
    const float want = std::tanh(std::max(xv[i] * 2.5f + bv[i % 33], 0.0f) - 0.5f) * xv[i];
    ASSERT_NEAR(got[i], want, 1e-6) << i;
  }
}

TEST(Compiler, MatmulEpilogueTakesBiasAndActivation) {
  ScopedRuntime rt;
  const Tensor x = iota({16, 24}), w = iota({24, 8}), b = iota({8}, 0.1f);
  const Tensor y = relu(matmul(x, w) + b);
  auto p = compile_roots({y});
  EXPECT_EQ(p->stats.kernels, 1);
  EXPECT_EQ(p->stats.matmul_epilogues, 1);
  const std::vector<float> got = y.to_vector<float>();
  const std::vector<float> mm = matmul(x, w).to_vector<float>(), bv = b.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], std::max(mm[i] + bv[i % 8], 0.0f), 1e-5) << i;
}

TEST(Compiler, MatmulUsedTwiceKeepsItsOwnResult) {
  ScopedRuntime rt;
  const Tensor x = iota({6, 5}), w = iota({5, 4});
  const Tensor m = matmul(x, w);
  Tensor a = relu(m), c = m * 3.0;
  mark_step();
  EXPECT_EQ(rt->last_stats().matmul_epilogues, 0);
  const std::vector<float> mv = m.to_vector<float>(), av = a.to_vector<float>(), cv = c.to_vector<float>();
  for (size_t i = 0; i < mv.size(); ++i) {
    EXPECT_EQ(av[i], std::max(mv[i], 0.0f));
    EXPECT_FLOAT_EQ(cv[i], mv[i] * 3.0f);
  }
}

TEST(Compiler, IntermediatesReuseStorageByLiveness) {
  ScopedRuntime rt;
  // A chain of matmuls: each intermediate dies when the next is made, so two arena slots
  // suffice however long the chain is.
  const Tensor w = iota({32, 32});
  Tensor h = iota({32, 32});
  for (int i = 0; i < 8; ++i) h = matmul(h, w);
  auto p = compile_roots({h});
  EXPECT_EQ(p->stats.kernels, 8);
  EXPECT_EQ(p->arena_slot_bytes.size(), 2u);
  EXPECT_EQ(p->stats.arena_bytes, 2 * 32 * 32 * 4);
}

// pack_arena_slots against the rule it documents, applied the slow way (every slot tried for
// every value), on random lifetimes: few sizes, so classes of equal slots are long, and
// lifetimes from one group to the whole program, as a deep network's saved activations.
TEST(Compiler, ArenaPackingIsTheDocumentedBestFit) {
  const auto reference = [](const std::vector<detail::ArenaLifetime>& values) {
    std::vector<int> order(values.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return values[a].bytes != values[b].bytes ? values[a].bytes > values[b].bytes : values[a].first < values[b].first;
    });
    detail::ArenaPacking out{std::vector<int>(values.size(), -1), {}};
    std::vector<std::vector<int>> held;  // values in each slot
    for (int i : order) {
      const detail::ArenaLifetime& x = values[i];
      int best = -1;
      for (size_t k = 0; k < held.size(); ++k) {
        const bool meets = std::any_of(held[k].begin(), held[k].end(), [&](int j) {
          return values[j].first <= x.last && x.first <= values[j].last;
        });
        if (!meets && (best < 0 || out.slot_bytes[k] < out.slot_bytes[best])) best = static_cast<int>(k);
      }
      if (best < 0) {
        best = static_cast<int>(held.size());
        held.emplace_back();
        out.slot_bytes.push_back(x.bytes);
      }
      held[best].push_back(i);
      out.slot_of[i] = best;
    }
    return out;
  };
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    const int groups = 1 + static_cast<int>(rng() % 300);
    const int n = static_cast<int>(rng() % 400);
    const size_t sizes = 1 + rng() % 4;
    std::vector<detail::ArenaLifetime> values;
    for (int i = 0; i < n; ++i) {
      const int first = static_cast<int>(rng() % groups);
      const int span = rng() % 4 == 0 ? static_cast<int>(rng() % groups) : static_cast<int>(rng() % 4);
      values.push_back({64 * (1 + rng() % sizes), first, std::min(groups - 1, first + span)});
    }
    const detail::ArenaPacking got = detail::pack_arena_slots(values);
    const detail::ArenaPacking want = reference(values);
    ASSERT_EQ(got.slot_of, want.slot_of) << "round " << round;
    ASSERT_EQ(got.slot_bytes, want.slot_bytes) << "round " << round;
  }
}

TEST(Compiler, ReductionSplitsLoopsAndInPlaceReusesDyingInputs) {
  ScopedRuntime rt;
  const Tensor x = iota({8, 16});
  const Tensor e = exp(x - max(x, {1}, true));
  const Tensor s = e / sum(e, {1}, true);  // softmax: reduce, loop and reduce, loop
  auto p = compile_roots({s});
  EXPECT_EQ(p->stats.kernels, 3);  // max of a leaf, the exp loop summing its values, the div loop
  EXPECT_EQ(p->stats.fused_reductions, 1);
  mark_step();
  const std::vector<float> v = s.to_vector<float>();
  for (int r = 0; r < 8; ++r) {
    double total = 0;
    for (int c = 0; c < 16; ++c) total += v[r * 16 + c];
    EXPECT_NEAR(total, 1.0, 1e-5);
  }
}

// A reduction joins the loop computing its operand, and whatever reads the reduction runs in
// a later kernel: centring by the mean (which reads the loop's value too), and a reduction
// over an axis of size 1, whose result has the loop's own shape.
TEST(Compiler, WhatReadsAFusedReductionRunsAfterTheLoopThatComputesIt) {
  for (bool codegen : {true, false}) {
    RuntimeOptions options = RuntimeOptions::from_env();
    options.codegen = codegen;
    ScopedRuntime rt(options);
    const Tensor a = iota({6, 37});
    const Tensor x = exp(a) * 2.0 + a;
    const Tensor centred = x - mean(x, {1}, true);
    const Tensor y = tanh(iota({6, 37, 1}));
    const Tensor z = y * 3.0 + sum(y, {2}, true);  // y * 3 + y, all of shape [6, 37, 1]
    auto p = compile_roots({centred, z});
    EXPECT_EQ(p->stats.fused_reductions, 2) << p->text();
    mark_step();
    const std::vector<float> av = a.to_vector<float>(), cv = centred.to_vector<float>(), zv = z.to_vector<float>();
    for (int r = 0; r < 6; ++r) {
      double total = 0;
      for (int c = 0; c < 37; ++c) total += std::exp(av[r * 37 + c]) * 2.0 + av[r * 37 + c];
      for (int c = 0; c < 37; ++c) {
        const int i = r * 37 + c;
        EXPECT_NEAR(cv[i], std::exp(av[i]) * 2.0 + av[i] - total / 37, 1e-5) << "codegen " << codegen << " " << i;
        EXPECT_NEAR(zv[i], 4 * std::tanh(av[i]), 1e-6) << "codegen " << codegen << " " << i;
      }
    }
  }
}

TEST(Compiler, UpdatedParameterOverwritesItsOldBuffer) {
  ScopedRuntime rt;
  Tensor w = iota({64, 16});
  const Tensor g = iota({64, 16}, 0.5f);
  const std::vector<float> before = w.to_vector<float>(), gv = g.to_vector<float>();
  const void* old_data = w.buffer()->data();
  w.assign(w - g * 0.1);
  mark_step();
  EXPECT_EQ(rt->last_stats().donated_outputs, 1);
  EXPECT_EQ(w.buffer()->data(), old_data) << "the update should have been written in place";
  const std::vector<float> after = w.to_vector<float>();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_FLOAT_EQ(after[i], before[i] - gv[i] * 0.1f);
}

TEST(Compiler, BufferStillReadElsewhereIsNotDonated) {
  ScopedRuntime rt;
  Tensor w = iota({8, 8});
  const Tensor keep = w;  // a second handle to the same data: must not be overwritten
  const std::vector<float> before = keep.to_vector<float>();
  Tensor w2 = w - 1.0;
  mark_step();
  EXPECT_EQ(rt->last_stats().donated_outputs, 0);
  EXPECT_EQ(keep.to_vector<float>(), before);
}

TEST(Compiler, ThousandNodeChainCompilesAndRuns) {
  ScopedRuntime rt;
  Tensor x = iota({4, 4});
  Tensor y = x;
  for (int i = 0; i < 500; ++i) y = tanh(y * 0.5);  // 1000 nodes (plus leaves)
  mark_step();
  // A loop takes at most 256 nodes (LLVM's time grows faster than a body's length): 256, 256,
  // 256 and 232.
  EXPECT_EQ(rt->last_stats().kernels, 4);
  EXPECT_EQ(rt->last_stats().fused_ops, 1000);
  EXPECT_GE(rt->last_stats().nodes_in, 1000);
  for (float v : y.to_vector<float>()) EXPECT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace xs

namespace xs {
namespace {

TEST(Compiler, EarlierLoopJoinsTheMatmulEpilogueThatConsumesIt) {
  ScopedRuntime rt;
  const Tensor x = iota({16, 24}), dy = iota({16, 8}), v = iota({24, 8}, 0.3f);
  const Tensor decayed = v * 0.9 + 0.5;                        // traced before the GEMM
  const Tensor update = decayed + matmul(x, dy, true, false);  // joins the GEMM's epilogue
  auto p = compile_roots({update});
  EXPECT_EQ(p->stats.kernels, 1);
  EXPECT_EQ(p->stats.matmul_epilogues, 1);
  const std::vector<float> got = update.to_vector<float>(), vv = v.to_vector<float>();
  const std::vector<float> g = matmul(x, dy, true, false).to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], vv[i] * 0.9f + 0.5f + g[i], 1e-5) << i;
}

TEST(Compiler, ScaledBufferPlusMatmulIsOneAccumulatingGemmWrittenIntoTheDonatedBuffer) {
  ScopedRuntime rt;
  const Tensor x = iota({16, 24}), dy = iota({16, 8});
  Tensor v = iota({24, 8}, 0.3f);
  const std::vector<float> vv = v.to_vector<float>();
  const std::vector<float> g = matmul(x, dy, true, false).to_vector<float>();
  const Tensor momentum = Tensor::scalar(0.9);
  v.assign(v * momentum + matmul(x, dy, true, false));  // SGD's momentum buffer update
  mark_step();
  EXPECT_EQ(rt->last_stats().kernels, 1);
  EXPECT_EQ(rt->last_stats().gemm_accumulates, 1);
  EXPECT_EQ(rt->last_stats().donated_outputs, 1);
  const std::vector<float> got = v.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], vv[i] * 0.9f + g[i], 1e-4) << i;
}

TEST(Compiler, LoopFeedingTheGemmIsNotMovedAfterIt) {
  ScopedRuntime rt;
  const Tensor x = iota({8, 8}), w = iota({8, 8}, 0.2f);
  const Tensor a = x * 2.0;                 // read by the GEMM
  const Tensor y = matmul(a, w) + a;        // and by its epilogue
  auto p = compile_roots({y});
  EXPECT_EQ(p->stats.kernels, 2);
  const std::vector<float> got = y.to_vector<float>(), av = a.to_vector<float>();
  const std::vector<float> m = matmul(a, w).to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], m[i] + av[i], 1e-5) << i;
}

}  // namespace
}  // namespace xs

namespace xs {
namespace {

// A conv bias [1, C, 1, 1] (and a [C, H, 1] operand) broadcast inside a fused loop: the
// operand is one run of middle dims, loaded in constant runs rather than per element.
TEST(Compiler, MiddleDimBroadcastInAFusedLoopMatchesTheHostResult) {
  ScopedRuntime rt;
  const Tensor x = iota({2, 3, 4, 5});
  const Tensor b = iota({1, 3, 1, 1}, 0.5f), c = iota({3, 4, 1}, 0.25f);
  const Tensor y = relu(x + b) * c;
  const std::vector<float> got = y.to_vector<float>(), xv = x.to_vector<float>();
  const std::vector<float> bv = b.to_vector<float>(), cv = c.to_vector<float>();
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t ch = 0; ch < 3; ++ch)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 5; ++j) {
          const int64_t at = ((n * 3 + ch) * 4 + i) * 5 + j;
          const float want = std::max(xv[at] + bv[ch], 0.0f) * cv[ch * 4 + i];
          ASSERT_FLOAT_EQ(got[at], want) << at;
        }
}

}  // namespace
}  // namespace xs
