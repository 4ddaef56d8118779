// The transformer pieces against naive host references: causal attention (values, and that no
// position sees a later one), the attention layer's shapes and gradients, LayerNorm's module
// defaults, and AdamW decaying only the parameters it is told to.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/compiler/compile.h"
#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/kernels/elementary.h"
#include "xla_spawn/runtime/kernels/row_sum.h"
#include "xla_spawn/runtime/nn/attention.h"
#include "xla_spawn/runtime/nn/embedding.h"
#include "xla_spawn/runtime/nn/layer_norm.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/optim/adam.h"
#include "xla_spawn/runtime/program.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

std::vector<double> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

// out[b][t] = sum_{s <= t} softmax_s(q[b][t] . k[b][s] / sqrt(d)) v[b][s], in double.
std::vector<double> naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, int64_t batch, int64_t t, int64_t d) {
  std::vector<double> out(q.size(), 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t base = b * t * d;
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> w(static_cast<size_t>(i + 1));
      double top = -1e300, total = 0;
      for (int64_t s = 0; s <= i; ++s) {
        double dot = 0;
        for (int64_t j = 0; j < d; ++j) dot += q[base + i * d + j] * k[base + s * d + j];
        w[s] = dot / std::sqrt(static_cast<double>(d));
        top = std::max(top, w[s]);
      }
      for (double& x : w) total += (x = std::exp(x - top));
      for (int64_t s = 0; s <= i; ++s) {
        for (int64_t j = 0; j < d; ++j) out[base + i * d + j] += w[s] / total * v[base + s * d + j];
      }
    }
  }
  return out;
}

TEST(CausalAttention, MatchesTheNaiveReferenceOverBatchAndHeads) {
  const int64_t b = 2, h = 3, t = 7, d = 5;
  const Shape shape{b, h, t, d};
  const size_t n = static_cast<size_t>(b * h * t * d);
  const std::vector<double> q = random_values(n, 1), k = random_values(n, 2), v = random_values(n, 3);
  const Tensor y = causal_attention(Tensor::from_vector<double>(q, shape), Tensor::from_vector<double>(k, shape),
                                    Tensor::from_vector<double>(v, shape));
  const std::vector<double> got = y.to_vector<double>(), want = naive_attention(q, k, v, b * h, t, d);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << "element " << i;
}

TEST(CausalAttention, APositionNeverSeesALaterOne) {
  const int64_t t = 6, d = 4;
  const size_t n = static_cast<size_t>(t * d);
  const std::vector<double> q = random_values(n, 4), k = random_values(n, 5), v = random_values(n, 6);
  std::vector<double> k2 = k, v2 = v;
  for (int64_t j = 0; j < d; ++j) k2[(t - 1) * d + j] += 3, v2[(t - 1) * d + j] -= 5;  // the last position
  auto run = [&](const std::vector<double>& kk, const std::vector<double>& vv) {
    return causal_attention(Tensor::from_vector<double>(q, {1, t, d}), Tensor::from_vector<double>(kk, {1, t, d}),
                            Tensor::from_vector<double>(vv, {1, t, d}))
        .to_vector<double>();
  };
  const std::vector<double> a = run(k, v), b = run(k2, v2);
  for (size_t i = 0; i < static_cast<size_t>((t - 1) * d); ++i) EXPECT_EQ(a[i], b[i]) << "element " << i;
  EXPECT_NE(a.back(), b.back()) << "the last position must see its own key and value";
}

// Forward and backward of causal attention at T = 70 (three row blocks, the last partial): the
// compiler marks all six products to skip the masked blocks (the scores and their gradient read
// causally, the probabilities and the scores' gradient triangular, plain and transposed), and
// the gradients are those of the same attention written with a mask tensor and a plain softmax,
// which nothing marks.
TEST(CausalAttention, ItsSixProductsSkipTheMaskedBlocksAndKeepTheGradients) {
  const int64_t b = 2, h = 2, t = 70, d = 5;
  const Shape shape{b, h, t, d};
  const size_t n = static_cast<size_t>(b * h * t * d);
  const std::vector<double> q = random_values(n, 11), k = random_values(n, 12), v = random_values(n, 13);
  std::vector<double> mask(static_cast<size_t>(t * t), 0.0);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = i + 1; j < t; ++j) mask[i * t + j] = -1e30;  // exp underflows to exactly 0
  struct Grads {
    std::vector<double> y, dq, dk, dv;
    int64_t causal_products;
  };
  auto run = [&](bool causal) {
    ScopedRuntime rt;
    Tensor tq = Tensor::from_vector<double>(q, shape), tk = Tensor::from_vector<double>(k, shape),
           tv = Tensor::from_vector<double>(v, shape);
    for (Tensor* x : {&tq, &tk, &tv}) x->set_requires_grad(true);
    Tensor y;
    if (causal) {
      y = causal_attention(tq, tk, tv);
    } else {
      const Tensor scores = matmul(tq, tk, false, true) * (1 / std::sqrt(static_cast<double>(d)));
      y = matmul(softmax(scores + Tensor::from_vector<double>(mask, {t, t}), -1), tv);
    }
    backward(sum(square(y)));
    const Tensor dq = tq.grad(), dk = tk.grad(), dv = tv.grad();
    mark_step();  // one program: the forward and the backward
    return Grads{y.to_vector<double>(), dq.to_vector<double>(), dk.to_vector<double>(), dv.to_vector<double>(),
                 rt->last_stats().causal_products};
  };
  const Grads marked = run(true), plain = run(false);
  EXPECT_EQ(marked.causal_products, 6);
  EXPECT_EQ(plain.causal_products, 0);
  const std::vector<double> want = naive_attention(q, k, v, b * h, t, d);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(marked.y[i], want[i], 1e-12) << "y " << i;
    ASSERT_NEAR(marked.dq[i], plain.dq[i], 1e-11) << "dq " << i;
    ASSERT_NEAR(marked.dk[i], plain.dk[i], 1e-11) << "dk " << i;
    ASSERT_NEAR(marked.dv[i], plain.dv[i], 1e-11) << "dv " << i;
  }
}

// The default path end to end: f32 [batch, heads, T, d] products, which run on oneDNN one row
// block at a time, against the double reference; and scores that the program also returns are
// computed whole (only the other five products are marked).
TEST(CausalAttention, F32ProductsOnTheDefaultPathAndScoresAlsoReturnedComputedWhole) {
  const int64_t b = 2, h = 2, t = 70, d = 5;
  const Shape shape{b, h, t, d};
  const size_t n = static_cast<size_t>(b * h * t * d);
  const std::vector<double> q = random_values(n, 21), k = random_values(n, 22), v = random_values(n, 23);
  ScopedRuntime rt;
  Tensor tq = Tensor::from_vector<double>(q, shape, DType::kF32), tk = Tensor::from_vector<double>(k, shape, DType::kF32),
         tv = Tensor::from_vector<double>(v, shape, DType::kF32);
  for (Tensor* x : {&tq, &tk, &tv}) x->set_requires_grad(true);
  const Tensor y = causal_attention(tq, tk, tv);
  backward(sum(square(y)));
  const Tensor dq = tq.grad();
  mark_step();
  EXPECT_EQ(rt->last_stats().causal_products, 6);
  const std::vector<double> got = y.to_vector<double>(), want = naive_attention(q, k, v, b * h, t, d);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << "y " << i;
  for (double g : dq.to_vector<double>()) ASSERT_TRUE(std::isfinite(g));

  // The same scores, now also a result: every entry is read, so that product runs whole.
  const Tensor scores = matmul(tq, tk, false, true);
  const Tensor y2 = matmul(causal_softmax(scores * (1 / std::sqrt(static_cast<double>(d)))), tv);
  backward(sum(square(y2)));
  const Tensor dq2 = tq.grad();
  mark_step();
  EXPECT_EQ(rt->last_stats().causal_products, 5);
  const std::vector<double> s = scores.to_vector<double>();
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < t; ++j) {
      double dot = 0;
      for (int64_t p = 0; p < d; ++p) dot += q[i * d + p] * k[j * d + p];
      ASSERT_NEAR(s[i * t + j], dot, 1e-5) << "scores (" << i << ", " << j << ")";
    }
  (void)dq2;
}

TEST(CausalAttention, RejectsQueriesKeysAndValuesOfDifferentShapes) {
  EXPECT_THROW(causal_attention(Tensor::zeros({1, 4, 2}), Tensor::zeros({1, 5, 2}), Tensor::zeros({1, 4, 2})),
               InvalidArgument);
}

TEST(CausalSelfAttention, KeepsTheShapeAndGivesEveryParameterAGradient) {
  Generator gen(3);
  CausalSelfAttention attn(8, 2, gen);
  const Tensor x = Tensor::from_vector<double>(random_values(2 * 5 * 8, 7), {2, 5, 8}, DType::kF32);
  const Tensor y = attn(x);
  EXPECT_EQ(y.shape(), (Shape{2, 5, 8}));
  backward(sum(square(y)));
  for (const auto& [name, p] : attn.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    double norm = 0;
    for (double g : p.grad().to_vector<double>()) norm += g * g;
    EXPECT_GT(norm, 0) << name;
  }
  EXPECT_THROW(attn(Tensor::zeros({2, 5, 6})), InvalidArgument) << "d_model 8, input 6";
  EXPECT_THROW(CausalSelfAttention(10, 3, gen), InvalidArgument) << "10 does not split into 3 heads";
}

TEST(LayerNormModule, StartsAsPlainStandardisationPerRow) {
  LayerNorm ln(6);
  const std::vector<double> x = random_values(4 * 6, 8);
  const std::vector<double> y = ln(Tensor::from_vector<double>(x, {4, 6}, DType::kF32)).to_vector<double>();
  for (int r = 0; r < 4; ++r) {
    double mean = 0, var = 0;
    for (int j = 0; j < 6; ++j) mean += y[r * 6 + j] / 6;
    for (int j = 0; j < 6; ++j) var += (y[r * 6 + j] - mean) * (y[r * 6 + j] - mean) / 6;
    EXPECT_NEAR(mean, 0, 1e-6) << "row " << r;
    EXPECT_NEAR(var, 1, 1e-4) << "row " << r << " (eps 1e-5 keeps it just under 1)";
  }
}

TEST(EmbeddingModule, LooksUpRowsAndRejectsAnIndexPastTheTable) {
  Generator gen(1);
  Embedding emb(4, 3, gen);
  const std::vector<float> table = emb.weight().to_vector<float>();
  const std::vector<float> got =
      emb(Tensor::from_vector<int64_t>({3, 0, 3}, {3})).to_vector<float>();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], table[9 + i]);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got[3 + i], table[i]);
  EXPECT_THROW(emb(Tensor::from_vector<int64_t>({4}, {1})).to_vector<float>(), InvalidArgument);
}

// With zero gradients Adam's step is zero, so what is left is the decoupled decay alone.
TEST(AdamWDecayMask, DecaysMatricesAndLeavesVectorsAlone) {
  Tensor w = Tensor::full_data({2, 2}, 2.0).set_requires_grad(true);
  Tensor b = Tensor::full_data({2}, 2.0).set_requires_grad(true);
  const std::vector<Tensor> params{w, b};
  EXPECT_EQ(decay_matrices_only(params), (std::vector<bool>{true, false}));
  AdamW opt(params, {.lr = 0.1, .weight_decay = 0.5}, decay_matrices_only(params));
  opt.apply({Tensor::zeros({2, 2}), Tensor::zeros({2})});
  mark_step();
  for (float v : w.to_vector<float>()) EXPECT_FLOAT_EQ(v, 2.0f * (1 - 0.1f * 0.5f));
  for (float v : b.to_vector<float>()) EXPECT_EQ(v, 2.0f);
  EXPECT_THROW(AdamW(params, {}, std::vector<bool>{true}), InvalidArgument) << "one flag for two parameters";
}

}  // namespace
}  // namespace xs

namespace xs {
namespace {

// The arena of a transformer's training step stays near the most bytes it ever has live at
// once: packed largest first into slots that are never grown. (Slots grown in program order,
// for a larger value when a smaller slot came free, left the GPT example's step 44% above.)
// The results do not depend on the packing; the suites' bit-identical reruns check that.
TEST(ArenaPacking, ATransformerStepKeepsItsArenaNearItsPeakOfLiveBytes) {
  ScopedRuntime rt;
  const int64_t b = 4, t = 32, d = 32, layers = 3;
  Generator gen(7);
  std::vector<std::shared_ptr<Module>> modules;
  std::vector<double> xv(static_cast<size_t>(b * t * d));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.37 * static_cast<double>(i));
  Tensor h = Tensor::from_vector<double>(xv, {b, t, d}, DType::kF32);
  for (int64_t l = 0; l < layers; ++l) {
    auto ln1 = std::make_shared<LayerNorm>(d), ln2 = std::make_shared<LayerNorm>(d);
    auto attn = std::make_shared<CausalSelfAttention>(d, 4, gen);
    auto fc = std::make_shared<Linear>(d, 4 * d, gen), proj = std::make_shared<Linear>(4 * d, d, gen);
    h = h + (*attn)((*ln1)(h));
    h = h + reshape((*proj)(gelu((*fc)(reshape((*ln2)(h), {b * t, d})))), {b, t, d});
    modules.insert(modules.end(), {ln1, ln2, attn, fc, proj});
  }
  backward(sum(square(h)));
  std::vector<NodePtr> roots{h.ir()};
  for (const auto& m : modules)
    for (const Tensor& p : m->parameters()) roots.push_back(p.grad().ir());
  const CompileStats stats = compile_graph(cut_graph(roots, /*allow_donation=*/false))->stats;
  ASSERT_GT(stats.peak_live_bytes, 0);
  EXPECT_GE(stats.arena_bytes, stats.peak_live_bytes);
  EXPECT_LE(static_cast<double>(stats.arena_bytes), 1.15 * static_cast<double>(stats.peak_live_bytes))
      << "arena " << stats.arena_bytes << " bytes, peak live " << stats.peak_live_bytes;
}

}  // namespace
}  // namespace xs

namespace xs {
namespace {

// The causal softmax and its gradient are, bit for bit, the row-by-row formulation over the
// n = r % T + 1 valid columns (row_sum's fixed lane order, which replicas rely on), computed
// here with the same helpers: rows of every length around the 16-lane width, and non-finite
// values in the masked columns, which must not reach the result (the masked product blocks
// are not always zeroed, e.g. scores that are also returned).
TEST(CausalSoftmaxKernel, EqualsTheValidColumnsFormulationBitForBit) {
  for (int64_t t : {1, 7, 16, 17, 37, 128}) {
    const int64_t rows = 2 * t;  // two matrices of T x T
    std::vector<float> x(static_cast<size_t>(rows * t)), g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<float>(std::sin(0.61 * static_cast<double>(i)) * 9.0);
      g[i] = static_cast<float>(std::cos(0.23 * static_cast<double>(i)) * 3.0);
      const int64_t r = static_cast<int64_t>(i) / t, c = static_cast<int64_t>(i) % t;
      if (c > r % t) {
        x[i] = (c % 3 == 0) ? NAN : (c % 3 == 1 ? INFINITY : 1e30f);
        g[i] = (c % 2 == 0) ? INFINITY : NAN;
      }
    }
    std::vector<float> want_y(x.size(), 0.0f), want_dx(x.size(), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r % t + 1;
      const float* xr = x.data() + r * t;
      float* yr = want_y.data() + r * t;
      const float top = detail::row_max(xr, n);
      for (int64_t j = 0; j < n; ++j) yr[j] = detail::exp_of(xr[j] - top);
      const double total = detail::row_sum(n, [&](int64_t j) { return static_cast<double>(yr[j]); });
      const float scale = static_cast<float>(1.0 / total);
      for (int64_t j = 0; j < n; ++j) yr[j] *= scale;
      const float* gr = g.data() + r * t;
      const float s = static_cast<float>(
          detail::row_sum(n, [&](int64_t j) { return static_cast<double>(yr[j]) * gr[j]; }));
      for (int64_t j = 0; j < n; ++j) want_dx[r * t + j] = yr[j] * (gr[j] - s);
    }
    ScopedRuntime rt;
    const Tensor tx = Tensor::from_vector<float>(x, {2, t, t});
    const Tensor y = causal_softmax(tx);
    const Tensor dx = softmax_grad(Tensor::from_vector<float>(want_y, {2, t, t}), Tensor::from_vector<float>(g, {2, t, t}), true);
    mark_step();
    const std::vector<float> got_y = y.to_vector<float>(), got_dx = dx.to_vector<float>();
    ASSERT_EQ(std::memcmp(got_y.data(), want_y.data(), x.size() * sizeof(float)), 0) << "softmax, T = " << t;
    ASSERT_EQ(std::memcmp(got_dx.data(), want_dx.data(), x.size() * sizeof(float)), 0) << "gradient, T = " << t;
  }
}

}  // namespace
}  // namespace xs
