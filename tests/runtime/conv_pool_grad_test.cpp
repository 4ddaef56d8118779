// The compiler's conv-gradient fusion (compiler/passes.h, fuse_conv_pool_grad): the conv
// gradients read the pooled gradient and the pool's input, route it one sample at a time, and
// the full-size max-pool gradient is never a kernel of its own. Results must equal the unfused
// ops run one graph at a time bit for bit (the same routing, the same GEMMs), NaNs included.
// Then the whole layer conv-bias-relu-pool as one conv2d kernel (fuse_conv_pool_forward), the
// bias-relu pool kernel, and the unit-stride col2im of conv2d_grad_input against a direct sum;
// the unit-stride im2col/col2im fast paths against the general (strided) ones bit for bit;
// unit-stride convolutions, by im2col or by kernel rows (kernels/conv_rows.h, c*kw >= 64),
// against direct sums.
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/scoped_env.h"
#include "xla_spawn/runtime/kernels/conv_rows.h"
#include "xla_spawn/runtime/kernels/im2col.h"
#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/compiler/compile.h"
#include "xla_spawn/runtime/program.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

// Pseudo-random values on a grid (ties inside pooling windows, windows clipped by the ReLU).
std::vector<float> grid_values(int64_t n, int salt) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i)
    v[i] = 0.25f * static_cast<float>(static_cast<int>((i * 2654435761u + salt * 97u) % 13) - 6);
  return v;
}

Tensor grid(const Shape& shape, int salt) {
  return Tensor::from_vector<float>(grid_values(numel(shape), salt), shape);
}

Tensor materialised(const Tensor& t) { return Tensor::from_vector<float>(t.to_vector<float>(), t.shape()); }

std::shared_ptr<Program> compile_roots(const std::vector<Tensor>& roots) {
  std::vector<NodePtr> nodes;
  for (const Tensor& t : roots) nodes.push_back(t.ir());
  return compile_graph(cut_graph(nodes, /*allow_donation=*/false));
}

// Bit-for-bit equality (NaN payloads included).
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) EXPECT_TRUE(std::isnan(got[i])) << i;
    else EXPECT_EQ(got[i], want[i]) << i;
  }
}

struct Case {
  int64_t batch, channels, out_channels, hw, kernel, conv_pad;
  int64_t pool, pool_stride, pool_pad;
  bool bias_relu;
  bool nan;  // a NaN in the pool's input: routing picks the first NaN in both forms
};

class ConvPoolGrad : public ::testing::TestWithParam<Case> {};

TEST_P(ConvPoolGrad, FusedConvGradientsMatchTheUnfusedOpsBitForBit) {
  // The runtime's own kernels: f32 layers of 16 input channels or more otherwise run unfused
  // on oneDNN (onednn_runs_f32_conv).
  testing::ScopedEnv runtime_conv("XLA_SPAWN_CONV", "runtime");
  ScopedRuntime rt;
  const Case c = GetParam();
  const std::vector<int64_t> one{1, 1}, cp{c.conv_pad, c.conv_pad}, k{c.kernel, c.kernel};
  const std::vector<int64_t> pk{c.pool, c.pool}, ps{c.pool_stride, c.pool_stride}, pp{c.pool_pad, c.pool_pad};
  const Tensor x = grid({c.batch, c.channels, c.hw, c.hw}, 1);
  const Tensor w = grid({c.out_channels, c.channels, c.kernel, c.kernel}, 2);
  const int64_t oh = c.hw + 2 * c.conv_pad - c.kernel + 1;
  std::vector<float> yv = grid_values(c.batch * c.out_channels * oh * oh, 3);
  if (c.nan) yv[5] = std::nanf("");
  const Tensor y = Tensor::from_vector<float>(yv, {c.batch, c.out_channels, oh, oh});
  const Tensor b = grid({c.out_channels}, 4);
  const Shape pooled = max_pool2d(y, pk, ps, pp).shape();
  const Tensor h = grid(pooled, 5);
  const auto route = [&](const Tensor& yy) {
    return c.bias_relu ? max_pool2d_bias_relu_grad(yy, b, h, pk, ps, pp) : max_pool2d_grad(yy, h, pk, ps, pp);
  };
  const Tensor g = route(y);
  const Tensor dw = conv2d_grad_weight(x, g, one, cp, k);
  const Tensor dx = conv2d_grad_input(g, w, one, cp, {c.hw, c.hw});

  auto program = compile_roots({dw, dx});
  for (const Kernel& kern : program->kernels) {
    EXPECT_NE(kern.op, Op::kMaxPool2dGrad) << program->text();
    if (kern.op == Op::kConv2dGradWeight || kern.op == Op::kConv2dGradInput) {
      EXPECT_EQ(kern.in_storage.size(), c.bias_relu ? 4u : 3u) << program->text();
    }
  }
  const Tensor g_ref = materialised(route(y));
  const std::vector<float> dw_ref = conv2d_grad_weight(x, g_ref, one, cp, k).to_vector<float>();
  const std::vector<float> dx_ref = conv2d_grad_input(g_ref, w, one, cp, {c.hw, c.hw}).to_vector<float>();
  expect_same_bits(dw.to_vector<float>(), dw_ref);
  expect_same_bits(dx.to_vector<float>(), dx_ref);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConvPoolGrad,
    ::testing::Values(Case{3, 2, 4, 8, 3, 1, 2, 2, 0, false, false},  // the 2x2 tiling
                      Case{3, 2, 4, 8, 3, 1, 2, 2, 0, true, false},   // with bias and ReLU
                      Case{2, 3, 5, 9, 3, 1, 2, 2, 0, true, false},   // odd size: last row unpooled
                      Case{2, 2, 3, 9, 5, 2, 3, 2, 1, true, false},   // overlapping, padded pool
                      Case{2, 1, 4, 20, 5, 2, 2, 2, 0, true, false},  // one input channel, w > 16
                      Case{2, 16, 4, 8, 5, 2, 2, 2, 0, true, false},  // conv by kernel rows
                      Case{2, 2, 3, 8, 3, 0, 2, 2, 0, false, true},   // NaN in the pool's input
                      Case{2, 2, 3, 8, 3, 1, 2, 2, 0, true, true}));  // NaN with bias and ReLU

TEST(ConvPoolGradFusion, PoolGradientReadElsewhereIsStillComputedAndNotFused) {
  ScopedRuntime rt;
  const Tensor x = grid({2, 2, 6, 6}, 1), y = grid({2, 3, 6, 6}, 2), h = grid({2, 3, 3, 3}, 3);
  const Tensor g = max_pool2d_grad(y, h, {2, 2}, {2, 2});
  const Tensor dw = conv2d_grad_weight(x, g, {1, 1}, {1, 1}, {3, 3});
  const Tensor also = g * 2.0;
  auto program = compile_roots({dw, also});
  bool pool_grad = false;
  for (const Kernel& kern : program->kernels) {
    pool_grad |= kern.op == Op::kMaxPool2dGrad;
    if (kern.op == Op::kConv2dGradWeight) {
      EXPECT_EQ(kern.in_storage.size(), 2u) << program->text();
    }
  }
  EXPECT_TRUE(pool_grad) << program->text();
  const Tensor g_ref = materialised(max_pool2d_grad(y, h, {2, 2}, {2, 2}));
  expect_same_bits(dw.to_vector<float>(), conv2d_grad_weight(x, g_ref, {1, 1}, {1, 1}, {3, 3}).to_vector<float>());
}

struct LayerCase {
  int64_t batch, channels, out_channels, hw, kernel, pad;
  bool nan;  // a NaN in x: relu zeroes the NaN outputs before pooling in both forms
};

class ConvLayerFusion : public ::testing::TestWithParam<LayerCase> {};

// conv -> + bias -> relu -> 2x2 pool and the pool's and conv's gradients: one conv2d kernel
// (pooled values + argmax), no pool or pool-gradient kernel, and every result bit for bit that
// of the ops run one graph at a time.
TEST_P(ConvLayerFusion, OneKernelLayerMatchesTheUnfusedOpsBitForBit) {
  // The runtime's own kernels: f32 layers of 16 input channels or more otherwise run unfused
  // on oneDNN (onednn_runs_f32_conv).
  testing::ScopedEnv runtime_conv("XLA_SPAWN_CONV", "runtime");
  ScopedRuntime rt;
  const LayerCase c = GetParam();
  const std::vector<int64_t> one{1, 1}, pad{c.pad, c.pad}, k{c.kernel, c.kernel}, two{2, 2};
  std::vector<float> xv = grid_values(c.batch * c.channels * c.hw * c.hw, 1);
  if (c.nan) xv[3] = std::nanf("");
  const Tensor x = Tensor::from_vector<float>(xv, {c.batch, c.channels, c.hw, c.hw});
  const Tensor w = grid({c.out_channels, c.channels, c.kernel, c.kernel}, 2);
  const Tensor b = reshape(grid({c.out_channels}, 3), {1, c.out_channels, 1, 1});
  const auto layer = [&](const Tensor& y, bool keep) {
    const Tensor r = keep ? materialised(relu(y + b)) : relu(y + b);
    const Tensor pooled = max_pool2d(r, two, two);
    const Tensor h = grid(pooled.shape(), 4);
    const Tensor g = keep ? materialised(max_pool2d_grad(r, h, two, two)) : max_pool2d_grad(r, h, two, two);
    return std::vector<Tensor>{pooled, conv2d_grad_weight(x, g, one, pad, k),
                               conv2d_grad_input(g, w, one, pad, {c.hw, c.hw})};
  };
  const std::vector<Tensor> fused = layer(conv2d(x, w, one, pad), false);
  auto program = compile_roots(fused);
  int convs = 0;
  for (const Kernel& kern : program->kernels) {
    EXPECT_NE(kern.op, Op::kMaxPool2d) << program->text();
    EXPECT_NE(kern.op, Op::kMaxPool2dGrad) << program->text();
    if (kern.op == Op::kConv2d) {
      ++convs;
      EXPECT_EQ(kern.in_storage.size(), 3u) << program->text();
    }
    if (kern.op == Op::kConv2dGradWeight || kern.op == Op::kConv2dGradInput) {
      EXPECT_EQ(kern.in_storage.size(), 3u) << program->text();
    }
  }
  EXPECT_EQ(convs, 1) << program->text();
  // One step runs that fused program: reading the results one at a time would compile graphs
  // of one root each, in which the pool is not needed and the conv is not fused, so the
  // routing by the stored argmax would go untested.
  mark_step();
  const std::vector<Tensor> ref = layer(materialised(conv2d(x, w, one, pad)), true);
  for (size_t i = 0; i < ref.size(); ++i) {
    SCOPED_TRACE(i);
    expect_same_bits(fused[i].to_vector<float>(), ref[i].to_vector<float>());
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvLayerFusion,
                         ::testing::Values(LayerCase{3, 1, 4, 8, 5, 2, false},    // 1 input channel
                                           LayerCase{2, 3, 5, 10, 3, 1, false},   // pooled 5x5
                                           LayerCase{2, 2, 3, 36, 3, 1, false},   // pooled rows over 16
                                           LayerCase{2, 1, 5, 28, 5, 2, false},   // the CNN's conv1
                                           LayerCase{2, 2, 4, 9, 2, 0, false},    // even output of odd input
                                           LayerCase{2, 2, 3, 8, 3, 1, true},     // NaN in the input
                                           LayerCase{2, 16, 6, 14, 5, 2, false},  // by kernel rows
                                           LayerCase{2, 24, 4, 10, 3, 1, true})); // rows, NaN

// The same in f64 (the kernels' scalar path): fused and unfused agree bit for bit.
TEST(ConvLayerFusion, F64LayerMatchesTheUnfusedOpsBitForBit) {
  ScopedRuntime rt;
  const auto grid64 = [](const Shape& shape, int salt) {
    const std::vector<float> f = grid_values(numel(shape), salt);
    return Tensor::from_vector<double>(std::vector<double>(f.begin(), f.end()), shape);
  };
  const auto keep = [](const Tensor& t) { return Tensor::from_vector<double>(t.to_vector<double>(), t.shape()); };
  const std::vector<int64_t> one{1, 1}, two{2, 2};
  const Tensor x = grid64({2, 2, 6, 6}, 1), w = grid64({3, 2, 3, 3}, 2);
  const Tensor b = reshape(grid64({3}, 3), {1, 3, 1, 1});
  const Tensor h = grid64({2, 3, 3, 3}, 4);
  const auto layer = [&](const Tensor& y, bool materialise) {
    const Tensor r = materialise ? keep(relu(y + b)) : relu(y + b);
    const Tensor g = materialise ? keep(max_pool2d_grad(r, h, two, two)) : max_pool2d_grad(r, h, two, two);
    return std::vector<Tensor>{max_pool2d(r, two, two), conv2d_grad_weight(x, g, one, one, {3, 3}),
                               conv2d_grad_input(g, w, one, one, {6, 6})};
  };
  const std::vector<Tensor> fused = layer(conv2d(x, w, one, one), false);
  auto program = compile_roots(fused);
  for (const Kernel& kern : program->kernels) {
    EXPECT_NE(kern.op, Op::kMaxPool2d) << program->text();
  }
  const std::vector<Tensor> ref = layer(keep(conv2d(x, w, one, one)), true);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(fused[i].to_vector<double>(), ref[i].to_vector<double>()) << i;
}

TEST(ConvLayerFusion, OddConvOutputKeepsThePoolKernel) {
  ScopedRuntime rt;
  const Tensor x = grid({2, 2, 7, 7}, 1), w = grid({3, 2, 3, 3}, 2);
  const Tensor b = reshape(grid({3}, 3), {1, 3, 1, 1});
  const Tensor pooled = max_pool2d(relu(conv2d(x, w, {1, 1}, {1, 1}) + b), {2, 2}, {2, 2});
  auto program = compile_roots({pooled});
  bool pool = false;
  for (const Kernel& kern : program->kernels) pool |= kern.op == Op::kMaxPool2d;
  EXPECT_TRUE(pool) << program->text();
}

// max_pool2d(relu(x + b)) runs as one pooling kernel, max_pool2d(x, b) = relu(max + b): equal
// to the unfused ops except that a NaN in x makes its window 0 (the NaN wins the max, then
// relu(NaN + b) is 0), where unfused relu zeroes the NaN first and the window's maximum wins.
TEST(PoolBiasRelu, OneKernelMatchesTheUnfusedOpsAndANanWindowGivesZero) {
  ScopedRuntime rt;
  std::vector<float> xv = grid_values(2 * 3 * 6 * 6, 1);
  xv[0] = std::nanf("");  // window (0, 0, 0, 0)
  const Tensor x = Tensor::from_vector<float>(xv, {2, 3, 6, 6}), b = grid({3}, 2);
  const Tensor pooled = max_pool2d(relu(x + reshape(b, {1, 3, 1, 1})), {2, 2}, {2, 2});
  auto program = compile_roots({pooled});
  int pools = 0;
  for (const Kernel& kern : program->kernels) {
    if (kern.op == Op::kMaxPool2d) {
      ++pools;
      EXPECT_EQ(kern.in_storage.size(), 2u) << program->text();
    }
    EXPECT_TRUE(kern.loop.steps.empty()) << "a bias-and-ReLU loop is left:\n" << program->text();
  }
  EXPECT_EQ(pools, 1) << program->text();
  const Tensor y_ref = materialised(relu(x + reshape(b, {1, 3, 1, 1})));
  const std::vector<float> want = max_pool2d(y_ref, {2, 2}, {2, 2}).to_vector<float>();
  std::vector<float> got = pooled.to_vector<float>();
  EXPECT_EQ(got[0], 0.0f);  // the NaN window: relu(NaN + b) = 0 after pooling
  EXPECT_GT(want[0], 0.0f);  // unfused, relu made the NaN 0 and the window's maximum won
  got[0] = want[0];
  expect_same_bits(got, want);  // every other window bit for bit
}

struct Col2imCase {
  int64_t channels, hw, kernel, pad;
};

class UnitStrideGradInput : public ::testing::TestWithParam<Col2imCase> {};

// dx[c][y][x] = sum over o, i, j of g[o][y + p - i][x + p - j] w[o][c][i][j] (in range).
TEST_P(UnitStrideGradInput, MatchesTheDirectSum) {
  ScopedRuntime rt;
  const Col2imCase c = GetParam();
  const int64_t n = 2, o = 3, oh = c.hw + 2 * c.pad - c.kernel + 1;
  const Tensor g = grid({n, o, oh, oh}, 7), w = grid({o, c.channels, c.kernel, c.kernel}, 8);
  const std::vector<float> got =
      conv2d_grad_input(g, w, {1, 1}, {c.pad, c.pad}, {c.hw, c.hw}).to_vector<float>();
  const std::vector<float> gv = g.to_vector<float>(), wv = w.to_vector<float>();
  ASSERT_EQ(got.size(), static_cast<size_t>(n * c.channels * c.hw * c.hw));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ci = 0; ci < c.channels; ++ci)
      for (int64_t y = 0; y < c.hw; ++y)
        for (int64_t xx = 0; xx < c.hw; ++xx) {
          double want = 0;
          for (int64_t oc = 0; oc < o; ++oc)
            for (int64_t i = 0; i < c.kernel; ++i)
              for (int64_t j = 0; j < c.kernel; ++j) {
                const int64_t oy = y + c.pad - i, ox = xx + c.pad - j;
                if (oy < 0 || oy >= oh || ox < 0 || ox >= oh) continue;
                want += static_cast<double>(gv[((b * o + oc) * oh + oy) * oh + ox]) *
                        wv[((oc * c.channels + ci) * c.kernel + i) * c.kernel + j];
              }
          const float v = got[((b * c.channels + ci) * c.hw + y) * c.hw + xx];
          EXPECT_NEAR(v, want, 1e-4 * (1 + std::abs(want))) << b << " " << ci << " " << y << " " << xx;
        }
}

INSTANTIATE_TEST_SUITE_P(Shapes, UnitStrideGradInput,
                         ::testing::Values(Col2imCase{2, 7, 3, 1},    // odd size, same padding
                                           Col2imCase{3, 14, 5, 2},   // the CNN's conv2 geometry
                                           Col2imCase{1, 37, 5, 2},   // rows over two 16-lane chunks
                                           Col2imCase{2, 6, 3, 0},    // no padding
                                           Col2imCase{2, 5, 3, 3}));  // padding beyond the kernel

struct PatchCase {
  int64_t channels, h, w, kh, kw, ph, pw;
};

class UnitStridePatches : public ::testing::TestWithParam<PatchCase> {};

// The unit-stride im2col and col2im give the bits of the general strided loops. (This file is
// built without the runtime's -march flags, so this checks the portable paths; the AVX-512
// ones inside the runtime are checked through the ops by UnitStrideConv below.)
TEST_P(UnitStridePatches, Im2colAndCol2imMatchTheGeneralLoopsBitForBit) {
  const PatchCase c = GetParam();
  const int64_t p[4] = {1, 1, c.ph, c.pw};
  const int64_t oh = c.h + 2 * c.ph - c.kh + 1, ow = c.w + 2 * c.pw - c.kw + 1;
  const int64_t rows = c.channels * c.kh * c.kw;
  const std::vector<float> x = grid_values(c.channels * c.h * c.w, 3);
  std::vector<float> want(rows * oh * ow, -7.0f), got(rows * oh * ow, -9.0f);
  std::vector<float> pad(detail::im2col_pad_size(c.channels, c.h, c.w, p));
  detail::im2col_strided(x.data(), c.channels, c.h, c.w, c.kh, c.kw, p, oh, ow, want.data());
  detail::im2col(x.data(), c.channels, c.h, c.w, c.kh, c.kw, p, oh, ow, got.data(), pad.data());
  expect_same_bits(got, want);

  std::vector<float> cols = grid_values(rows * oh * ow, 5);
  for (size_t i = 0; i < cols.size(); i += 7) cols[i] *= 1.0e-3f;  // sums that round
  std::vector<float> dx_want(x.size(), 0.0f), dx_got(x.size(), -9.0f);
  detail::col2im(cols.data(), c.channels, c.h, c.w, c.kh, c.kw, p, oh, ow, dx_want.data());
  detail::col2im_unit_direct(cols.data(), c.channels, c.h, c.w, c.kh, c.kw, c.ph, c.pw, oh, ow,
                             dx_got.data());
  expect_same_bits(dx_got, dx_want);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, UnitStridePatches,
    ::testing::Values(PatchCase{32, 14, 14, 5, 5, 2, 2},  // the CNN's conv2
                      PatchCase{1, 28, 28, 5, 5, 2, 2},   // conv1: rows over 16 lanes
                      PatchCase{3, 17, 33, 3, 3, 1, 1},   // three chunks, odd sizes
                      PatchCase{2, 9, 40, 7, 3, 3, 1},    // kh != kw, ph != pw
                      PatchCase{2, 5, 5, 3, 3, 2, 2},     // padding as wide as the kernel
                      PatchCase{2, 6, 7, 3, 3, 0, 0},     // no padding
                      PatchCase{1, 3, 40, 1, 35, 0, 3},   // kw over col2im's mask table
                      PatchCase{2, 4, 1, 3, 1, 1, 0}));   // one column

struct RowsCase {
  int64_t channels, out_channels, h, w, kh, kw, ph, pw;
  DType dtype;
};

class UnitStrideConv : public ::testing::TestWithParam<RowsCase> {};

Tensor grid_as(const Shape& shape, int salt, DType dtype) {
  const std::vector<float> f = grid_values(numel(shape), salt);
  if (dtype == DType::kF32) return Tensor::from_vector<float>(f, shape);
  return Tensor::from_vector<double>(std::vector<double>(f.begin(), f.end()), shape);
}

std::vector<double> values(const Tensor& t) {
  if (t.dtype() == DType::kF64) return t.to_vector<double>();
  const std::vector<float> f = t.to_vector<float>();
  return {f.begin(), f.end()};
}

// conv2d, conv2d_grad_input and conv2d_grad_weight against direct sums over
// the same x, w and output gradient g (y[o][oy][ox] = sum x[c][oy - ph + i][ox - pw + j] w).
TEST_P(UnitStrideConv, ForwardAndGradientsMatchDirectSums) {
  // The runtime's own kernels: f32 layers of 16 input channels or more otherwise run unfused
  // on oneDNN (onednn_runs_f32_conv).
  testing::ScopedEnv runtime_conv("XLA_SPAWN_CONV", "runtime");
  ScopedRuntime rt;
  const RowsCase c = GetParam();
  const int64_t n = 2, oh = c.h + 2 * c.ph - c.kh + 1, ow = c.w + 2 * c.pw - c.kw + 1;
  const Tensor x = grid_as({n, c.channels, c.h, c.w}, 1, c.dtype);
  const Tensor w = grid_as({c.out_channels, c.channels, c.kh, c.kw}, 2, c.dtype);
  const Tensor g = grid_as({n, c.out_channels, oh, ow}, 3, c.dtype);
  const std::vector<int64_t> one{1, 1}, pad{c.ph, c.pw};
  const std::vector<double> y = values(conv2d(x, w, one, pad));
  const std::vector<double> dx = values(conv2d_grad_input(g, w, one, pad, {c.h, c.w}));
  const std::vector<double> dw = values(conv2d_grad_weight(x, g, one, pad, {c.kh, c.kw}));
  const std::vector<double> xv = values(x), wv = values(w), gv = values(g);
  std::vector<double> y_ref(y.size()), dx_ref(dx.size()), dw_ref(dw.size());
  ASSERT_EQ(y.size(), static_cast<size_t>(n * c.out_channels * oh * ow));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < c.out_channels; ++o)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          const int64_t yi = ((b * c.out_channels + o) * oh + oy) * ow + ox;
          for (int64_t ci = 0; ci < c.channels; ++ci)
            for (int64_t i = 0; i < c.kh; ++i)
              for (int64_t j = 0; j < c.kw; ++j) {
                const int64_t yy = oy - c.ph + i, xx = ox - c.pw + j;
                if (yy < 0 || yy >= c.h || xx < 0 || xx >= c.w) continue;
                const int64_t xi = ((b * c.channels + ci) * c.h + yy) * c.w + xx;
                const int64_t wi = ((o * c.channels + ci) * c.kh + i) * c.kw + j;
                y_ref[yi] += xv[xi] * wv[wi];
                dx_ref[xi] += gv[yi] * wv[wi];
                dw_ref[wi] += gv[yi] * xv[xi];
              }
        }
  const double tol = c.dtype == DType::kF32 ? 1e-4 : 1e-12;
  for (const auto& [got, want] : {std::pair{&y, &y_ref}, std::pair{&dx, &dx_ref}, std::pair{&dw, &dw_ref}}) {
    ASSERT_EQ(got->size(), want->size());
    for (size_t i = 0; i < got->size(); ++i)
      ASSERT_NEAR((*got)[i], (*want)[i], tol * (1 + std::abs((*want)[i]))) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, UnitStrideConv,
    ::testing::Values(RowsCase{1, 4, 28, 28, 5, 5, 2, 2, DType::kF32},   // conv1: im2col, w > 16
                      RowsCase{3, 2, 9, 20, 3, 5, 1, 2, DType::kF32},    // im2col, kh != kw
                      RowsCase{2, 3, 5, 6, 3, 3, 3, 3, DType::kF32},     // im2col, padding > kernel
                      RowsCase{32, 8, 14, 14, 5, 5, 2, 2, DType::kF32},  // conv2: kernel rows
                      RowsCase{13, 3, 9, 20, 3, 5, 1, 2, DType::kF32},   // kh != kw, w > 16
                      RowsCase{22, 4, 7, 6, 3, 3, 0, 0, DType::kF32},    // no padding
                      RowsCase{16, 2, 5, 5, 4, 4, 3, 3, DType::kF32},    // padding beyond the kernel
                      RowsCase{16, 3, 6, 7, 5, 5, 2, 2, DType::kF64}));  // f64 (cblas_dgemm)

}  // namespace
}  // namespace xs
