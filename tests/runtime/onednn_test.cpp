// The kernels the runtime runs on oneDNN (runtime/kernels/onednn.h), through the public ops
// and mark_step. bf16 matmul and convolution: against double references with bf16 tolerances
// on awkward shapes, their gradients through autograd, the convert + sgemm fallback
// (XLA_SPAWN_BF16_ENGINE=convert) agreeing, and bit-identical results across runs and
// processes. f32 convolutions of 16 input channels or more: unfused on oneDNN, agreeing with
// the runtime's fused layer (XLA_SPAWN_CONV=runtime).
//
// Inputs are multiples of 1/64 below 1 in magnitude, exact in bf16, so the reference is
// exact and the only errors are the engine's: f32 accumulation and one rounding to bf16
// (relative 2^-9), hence |got - want| <= 2^-8 * sum |terms| + 1e-6.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "tests/support/child_with_deadline.h"
#include "tests/support/scoped_env.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/compiler/compile.h"
#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/kernels/onednn.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/program.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

constexpr double kRel = 1.0 / 256;  // 2^-8: one bf16 rounding (2^-9) with room for f32 sums

// Values from (salt, index), multiples of 1/64 in [-0.75, 0.75]: exact in bf16.
std::vector<float> pattern(int64_t n, int salt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 37 + salt * 11) % 97 - 48) / 64.0f;
  return v;
}

Tensor bf16(const std::vector<float>& v, const Shape& shape) {
  return Tensor::from_vector<float>(v, shape, DType::kBF16);
}

// The kernels of the program that computes `roots` (compiled, not run), as text.
std::string program_text(const std::vector<Tensor>& roots) {
  std::vector<NodePtr> nodes;
  for (const Tensor& t : roots) nodes.push_back(t.ir());
  return compile_graph(cut_graph(nodes, /*allow_donation=*/false))->text();
}

// Checks got[i] against want[i] within kRel * scale[i] + 1e-6.
void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                  const std::vector<double>& scale, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], kRel * scale[i] + 1e-6) << what << " at " << i;
}

// ---- matmul ----

struct MatmulCase {
  Shape a_batch, b_batch;  // batch axes of each operand (broadcast against each other)
  int64_t m, n, k;
  bool ta, tb;
};

std::string case_name(const MatmulCase& c) {
  return fmt::format("[{}]x[{}] {}x{}x{} ta {} tb {}", fmt::join(c.a_batch, ","),
                     fmt::join(c.b_batch, ","), c.m, c.n, c.k, c.ta, c.tb);
}

struct MatmulData {
  Shape as, bs;
  std::vector<float> a, b;
};

MatmulData matmul_data(const MatmulCase& c) {
  MatmulData d;
  d.as = c.a_batch;
  d.as.push_back(c.ta ? c.k : c.m);
  d.as.push_back(c.ta ? c.m : c.k);
  d.bs = c.b_batch;
  d.bs.push_back(c.tb ? c.n : c.k);
  d.bs.push_back(c.tb ? c.k : c.n);
  d.a = pattern(numel(d.as), 1);
  d.b = pattern(numel(d.bs), 2);
  return d;
}

// The double reference of matmul(a, b, ta, tb) with broadcast batch axes, and each output's
// sum of |terms|, in the output's row-major order.
void matmul_reference(const MatmulCase& c, const MatmulData& d, std::vector<double>& want,
                      std::vector<double>& scale) {
  const size_t rank = std::max(c.a_batch.size(), c.b_batch.size());
  Shape batch(rank, 1), ab(rank, 1), bb(rank, 1);
  std::copy(c.a_batch.begin(), c.a_batch.end(), ab.end() - c.a_batch.size());
  std::copy(c.b_batch.begin(), c.b_batch.end(), bb.end() - c.b_batch.size());
  for (size_t i = 0; i < rank; ++i) batch[i] = std::max(ab[i], bb[i]);
  want.clear();
  scale.clear();
  std::vector<int64_t> coord(rank, 0);
  for (int64_t t = 0; t < numel(batch); ++t) {
    int64_t oa = 0, ob = 0;
    for (size_t i = 0; i < rank; ++i) {
      oa = oa * ab[i] + (ab[i] == 1 ? 0 : coord[i]);
      ob = ob * bb[i] + (bb[i] == 1 ? 0 : coord[i]);
    }
    const float* a = d.a.data() + oa * c.m * c.k;
    const float* b = d.b.data() + ob * c.k * c.n;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double s = 0, abs_sum = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double x = c.ta ? a[p * c.m + i] : a[i * c.k + p];
          const double y = c.tb ? b[j * c.k + p] : b[p * c.n + j];
          s += x * y;
          abs_sum += std::fabs(x * y);
        }
        want.push_back(s);
        scale.push_back(abs_sum);
      }
    for (size_t i = rank; i-- > 0;) {
      if (++coord[i] < batch[i]) break;
      coord[i] = 0;
    }
  }
}

class Bf16Matmul : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(Bf16Matmul, MatchesADoubleReferenceWithinBf16Rounding) {
  ScopedRuntime rt;
  const MatmulCase c = GetParam();
  const MatmulData d = matmul_data(c);
  const Tensor y = matmul(bf16(d.a, d.as), bf16(d.b, d.bs), c.ta, c.tb);
  mark_step();
  EXPECT_EQ(y.dtype(), DType::kBF16);
  std::vector<double> want, scale;
  matmul_reference(c, d, want, scale);
  expect_close(y.to_vector<float>(), want, scale, case_name(c));
}

TEST_P(Bf16Matmul, TheConvertFallbackAgreesWithinBf16Rounding) {
  const MatmulCase c = GetParam();
  const MatmulData d = matmul_data(c);
  std::vector<float> fast, plain;
  {
    ScopedRuntime rt;
    const Tensor y = matmul(bf16(d.a, d.as), bf16(d.b, d.bs), c.ta, c.tb);
    fast = y.to_vector<float>();
  }
  {
    testing::ScopedEnv convert("XLA_SPAWN_BF16_ENGINE", "convert");
    ScopedRuntime rt;
    const Tensor y = matmul(bf16(d.a, d.as), bf16(d.b, d.bs), c.ta, c.tb);
    EXPECT_EQ(program_text({y}).find("onednn"), std::string::npos) << "convert must not use oneDNN";
    plain = y.to_vector<float>();
  }
  std::vector<double> want, scale;
  matmul_reference(c, d, want, scale);
  // Both are within kRel of the exact value, so within 2 kRel of each other.
  std::vector<double> fast_d(fast.begin(), fast.end());
  for (double& s : scale) s *= 2;
  expect_close(plain, fast_d, scale, case_name(c));
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardShapes, Bf16Matmul,
    ::testing::Values(MatmulCase{{}, {}, 1, 1, 1, false, false},
                      MatmulCase{{}, {}, 7, 5, 3, false, false},
                      MatmulCase{{}, {}, 7, 5, 3, true, true},
                      MatmulCase{{}, {}, 0, 5, 3, false, false},    // no rows
                      MatmulCase{{}, {}, 4, 5, 0, false, false},    // empty sum: zeros
                      MatmulCase{{}, {}, 33, 17, 65, true, false},  // off 16/32 multiples
                      MatmulCase{{}, {}, 31, 47, 129, false, true},
                      MatmulCase{{}, {}, 128, 10, 512, false, false},  // the MLP's last layer
                      MatmulCase{{}, {}, 784, 512, 128, true, false},  // its weight gradient
                      MatmulCase{{3}, {3}, 9, 7, 17, false, false},    // batched
                      MatmulCase{{2, 1}, {3}, 5, 6, 7, true, true},    // broadcast batch
                      MatmulCase{{}, {4}, 5, 3, 8, false, true},       // 2-D a against a batch
                      MatmulCase{{0}, {0}, 3, 3, 3, false, false}));   // empty batch

// The program holds the primitive: the bf16 matmul kernel is oneDNN's where the engine is on.
TEST(Bf16Engine, TheCompiledProgramRunsTheMatmulOnOnednn) {
  ScopedRuntime rt;
  if (!detail::use_onednn_bf16()) GTEST_SKIP() << "no AVX512_BF16/AMX: bf16 converts to f32";
  const Tensor y = matmul(bf16(pattern(64, 1), {8, 8}), bf16(pattern(64, 2), {8, 8}));
  const std::string text = program_text({y});
  EXPECT_NE(text.find("[onednn "), std::string::npos) << text;
}

TEST(Bf16Engine, ABadEngineValueIsRejectedNamingTheChoices) {
  testing::ScopedEnv bad("XLA_SPAWN_BF16_ENGINE", "fast");
  try {
    detail::use_onednn_bf16();
    FAIL() << "accepted XLA_SPAWN_BF16_ENGINE=fast";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("auto, onednn or convert"), std::string::npos) << e.what();
  }
}

// loss = sum(matmul(a, b) * w): da = w b^T, db = a^T w, both bf16 GEMMs on the same engine.
TEST(Bf16Engine, MatmulGradientsMatchADoubleReference) {
  ScopedRuntime rt;
  const int64_t m = 19, k = 37, n = 23;
  const std::vector<float> av = pattern(m * k, 1), bv = pattern(k * n, 2), wv = pattern(m * n, 3);
  Tensor a = bf16(av, {m, k}), b = bf16(bv, {k, n});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  backward(sum(matmul(a, b) * bf16(wv, {m, n})));
  mark_step();
  std::vector<double> da, da_scale, db, db_scale;
  matmul_reference({{}, {}, m, k, n, false, true}, {{m, n}, {k, n}, wv, bv}, da, da_scale);
  matmul_reference({{}, {}, k, n, m, true, false}, {{m, k}, {m, n}, av, wv}, db, db_scale);
  EXPECT_EQ(a.grad().dtype(), DType::kBF16);
  expect_close(a.grad().to_vector<float>(), da, da_scale, "da");
  expect_close(b.grad().to_vector<float>(), db, db_scale, "db");
}

// ---- convolution ----

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw, stride, pad;
};

std::string case_name(const ConvCase& c) {
  return fmt::format("x [{},{},{},{}] w [{},{},{},{}] stride {} pad {}", c.n, c.c, c.h, c.w, c.o,
                     c.c, c.kh, c.kw, c.stride, c.pad);
}

int64_t out_size(int64_t in, int64_t k, const ConvCase& c) {
  return (in + 2 * c.pad - k) / c.stride + 1;
}

// y[b][o][i][j] = sum x[b][ci][i*s - p + u][j*s - p + v] w[o][ci][u][v], with the visitor
// called for every term (b, o, i, j, ci, u, v, x index, w index).
void for_each_conv_term(const ConvCase& c,
                        const std::function<void(int64_t y, int64_t xi, int64_t wi)>& term) {
  const int64_t oh = out_size(c.h, c.kh, c), ow = out_size(c.w, c.kw, c);
  for (int64_t b = 0; b < c.n; ++b)
    for (int64_t o = 0; o < c.o; ++o)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j)
          for (int64_t ci = 0; ci < c.c; ++ci)
            for (int64_t u = 0; u < c.kh; ++u)
              for (int64_t v = 0; v < c.kw; ++v) {
                const int64_t yy = i * c.stride - c.pad + u, xx = j * c.stride - c.pad + v;
                if (yy < 0 || yy >= c.h || xx < 0 || xx >= c.w) continue;
                term(((b * c.o + o) * oh + i) * ow + j, ((b * c.c + ci) * c.h + yy) * c.w + xx,
                     ((o * c.c + ci) * c.kh + u) * c.kw + v);
              }
}

class Bf16Conv : public ::testing::TestWithParam<ConvCase> {};

// Forward and both gradients: loss = sum(conv2d(x, w) * g), so dx = conv2d_grad_input(g, w) and
// dw = conv2d_grad_weight(x, g).
TEST_P(Bf16Conv, ForwardAndGradientsMatchADoubleReference) {
  ScopedRuntime rt;
  const ConvCase c = GetParam();
  const int64_t oh = out_size(c.h, c.kh, c), ow = out_size(c.w, c.kw, c);
  const Shape xs{c.n, c.c, c.h, c.w}, ws{c.o, c.c, c.kh, c.kw}, ys{c.n, c.o, oh, ow};
  const std::vector<float> xv = pattern(numel(xs), 1), wv = pattern(numel(ws), 2),
                           gv = pattern(numel(ys), 3);
  Tensor x = bf16(xv, xs), w = bf16(wv, ws);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const Tensor y = conv2d(x, w, {c.stride, c.stride}, {c.pad, c.pad});
  backward(sum(y * bf16(gv, ys)));
  mark_step();
  std::vector<double> y_ref(numel(ys)), y_scale(numel(ys));
  std::vector<double> dx(numel(xs)), dx_scale(numel(xs)), dw(numel(ws)), dw_scale(numel(ws));
  for_each_conv_term(c, [&](int64_t yi, int64_t xi, int64_t wi) {
    y_ref[yi] += double{xv[xi]} * wv[wi], y_scale[yi] += std::fabs(double{xv[xi]} * wv[wi]);
    dx[xi] += double{gv[yi]} * wv[wi], dx_scale[xi] += std::fabs(double{gv[yi]} * wv[wi]);
    dw[wi] += double{gv[yi]} * xv[xi], dw_scale[wi] += std::fabs(double{gv[yi]} * xv[xi]);
  });
  expect_close(y.to_vector<float>(), y_ref, y_scale, "y " + case_name(c));
  expect_close(x.grad().to_vector<float>(), dx, dx_scale, "dx " + case_name(c));
  expect_close(w.grad().to_vector<float>(), dw, dw_scale, "dw " + case_name(c));
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardShapes, Bf16Conv,
    ::testing::Values(ConvCase{2, 1, 28, 28, 32, 5, 5, 1, 2},   // the CNN's conv1
                      ConvCase{2, 32, 14, 14, 64, 5, 5, 1, 2},  // its conv2
                      ConvCase{1, 1, 1, 1, 1, 1, 1, 1, 0},
                      ConvCase{3, 7, 9, 11, 5, 3, 2, 2, 1},  // kh != kw, stride 2, odd sizes
                      ConvCase{1, 3, 7, 7, 17, 7, 7, 1, 0},  // kernel as large as the input
                      ConvCase{2, 2, 5, 6, 3, 3, 3, 3, 2},   // stride past the last window
                      ConvCase{2, 9, 9, 7, 20, 3, 3, 1, 1},  // channels off 16-blocks
                      ConvCase{1, 16, 6, 5, 17, 3, 2, 2, 1},
                      ConvCase{0, 3, 5, 5, 4, 3, 3, 1, 1}));  // empty batch

// bf16 convolutions run on oneDNN, except the input gradient of a layer with fewer than 8
// input channels (the blocked layouts' padding loses there: linalg.cpp).
TEST(Bf16Engine, ConvolutionsRunOnOnednnButNarrowInputGradientsConvert) {
  ScopedRuntime rt;
  if (!detail::use_onednn_bf16()) GTEST_SKIP() << "no AVX512_BF16/AMX: bf16 converts to f32";
  const auto on_onednn = [](const std::string& text, const std::string& op) {
    const size_t at = text.find(" = " + op + "(");
    EXPECT_NE(at, std::string::npos) << op << " not in\n" << text;
    return text.substr(at, text.find('\n', at) - at).find("[onednn ") != std::string::npos;
  };
  for (int64_t c : {1, 8}) {
    const Tensor x = bf16(pattern(2 * c * 36, 1), {2, c, 6, 6});
    const Tensor w = bf16(pattern(4 * c * 9, 2), {4, c, 3, 3});
    const Tensor g = bf16(pattern(2 * 4 * 36, 3), {2, 4, 6, 6});
    const std::string text =
        program_text({conv2d(x, w, {1, 1}, {1, 1}), conv2d_grad_input(g, w, {1, 1}, {1, 1}, {6, 6}),
                      conv2d_grad_weight(x, g, {1, 1}, {1, 1}, {3, 3})});
    EXPECT_TRUE(on_onednn(text, "conv2d")) << text;
    EXPECT_TRUE(on_onednn(text, "conv2d_grad_weight")) << text;
    EXPECT_EQ(on_onednn(text, "conv2d_grad_input"), c >= 8) << text;
  }
}

// ---- f32 convolutions ----

// The CNN's conv2 layer (conv, bias, relu, 2x2 pool) and its gradients, as float vectors:
// pooled output, dx, dw, db; and the program's text.
struct LayerResult {
  std::vector<std::vector<float>> values;
  std::string program;
};

LayerResult conv_layer_step() {
  ScopedRuntime rt;
  Tensor x = Tensor::from_vector<float>(pattern(4 * 32 * 14 * 14, 1), {4, 32, 14, 14});
  Tensor w = Tensor::from_vector<float>(pattern(64 * 32 * 25, 2), {64, 32, 5, 5});
  Tensor b = Tensor::from_vector<float>(pattern(64, 3), {1, 64, 1, 1});
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
  const Tensor pooled = max_pool2d(relu(conv2d(x, w, {1, 1}, {2, 2}) + b), {2, 2}, {2, 2});
  backward(sum(pooled * Tensor::from_vector<float>(pattern(4 * 64 * 49, 4), {4, 64, 7, 7})));
  LayerResult r;
  r.program = program_text({pooled, x.grad(), w.grad(), b.grad()});
  for (const Tensor& t : {pooled, x.grad(), w.grad(), b.grad()})
    r.values.push_back(t.to_vector<float>());
  return r;
}

TEST(OnednnF32Conv, AWideLayerRunsUnfusedOnOnednnAndAgreesWithTheFusedKernels) {
  const LayerResult onednn = conv_layer_step();
  LayerResult fused;
  {
    testing::ScopedEnv runtime_conv("XLA_SPAWN_CONV", "runtime");
    fused = conv_layer_step();
  }
  for (const std::string op : {"conv2d", "conv2d_grad_input", "conv2d_grad_weight"}) {
    const size_t at = onednn.program.find(" = " + op + "(");
    ASSERT_NE(at, std::string::npos) << op << " not in\n" << onednn.program;
    EXPECT_NE(onednn.program.substr(at, onednn.program.find('\n', at) - at).find("[onednn "),
              std::string::npos)
        << op << " is not on oneDNN:\n"
        << onednn.program;
  }
  EXPECT_EQ(fused.program.find("[onednn "), std::string::npos) << fused.program;
  const char* names[] = {"pooled", "dx", "dw", "db"};
  for (size_t i = 0; i < fused.values.size(); ++i) {
    double peak = 0;
    for (float v : fused.values[i]) peak = std::max(peak, static_cast<double>(std::fabs(v)));
    for (size_t j = 0; j < fused.values[i].size(); ++j)
      ASSERT_NEAR(onednn.values[i][j], fused.values[i][j], 1e-5 * peak) << names[i] << " at " << j;
  }
}

TEST(OnednnF32Conv, ABadConvValueIsRejectedNamingTheChoices) {
  testing::ScopedEnv bad("XLA_SPAWN_CONV", "onednn");
  EXPECT_THROW(detail::onednn_runs_f32_conv(32), InvalidArgument);
}

// ---- determinism ----

// A bf16 step (matmul, its gradients, a conv and its gradients) as raw bits.
std::vector<uint16_t> bf16_step_bits() {
  ScopedRuntime rt;
  Tensor a = bf16(pattern(128 * 784, 1), {128, 784}), w1 = bf16(pattern(784 * 96, 2), {784, 96});
  Tensor x = bf16(pattern(8 * 32 * 14 * 14, 3), {8, 32, 14, 14}),
         w2 = bf16(pattern(64 * 32 * 25, 4), {64, 32, 5, 5});
  w1.set_requires_grad(true);
  w2.set_requires_grad(true);
  x.set_requires_grad(true);
  backward(sum(matmul(a, w1) * 0.5) + sum(conv2d(x, w2, {1, 1}, {2, 2}) * 0.25));
  mark_step();
  std::vector<uint16_t> bits;
  for (const Tensor& t : {w1.grad(), w2.grad(), x.grad()})
    for (BF16 v : t.to_vector<BF16>()) bits.push_back(v.bits);
  return bits;
}

TEST(Bf16Engine, AStepGivesTheSameBitsOnEveryRunAndInAnotherProcess) {
  const std::vector<uint16_t> first = bf16_step_bits();
  EXPECT_EQ(bf16_step_bits(), first) << "a second run in this process";
  const testing::ChildOutcome child = testing::run_in_child(
      [&] { return bf16_step_bits() == first ? 0 : 1; }, std::chrono::seconds(60));
  ASSERT_FALSE(child.hung);
  EXPECT_EQ(child.exit_code, 0) << "a forked process computed other bits";
}

// The f32 layer on oneDNN, bit for bit (memcmp, so a sign of zero counts too).
bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() ||
        std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

TEST(OnednnF32Conv, AWideLayerGivesTheSameBitsOnEveryRunAndInAnotherProcess) {
  const std::vector<std::vector<float>> first = conv_layer_step().values;
  EXPECT_TRUE(same_bits(conv_layer_step().values, first)) << "a second run in this process";
  const testing::ChildOutcome child = testing::run_in_child(
      [&] { return same_bits(conv_layer_step().values, first) ? 0 : 1; }, std::chrono::seconds(60));
  ASSERT_FALSE(child.hung);
  EXPECT_EQ(child.exit_code, 0) << "a forked process computed other bits";
}

}  // namespace
}  // namespace xs
