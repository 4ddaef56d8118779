// Conformance cases for the leaf, layout, linear-algebra, indexing, random and collective
// ops (the elementwise and reduction cases are in conformance_test.cpp).
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/runtime/collective_ops.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"
#include "tests/runtime/reference.h"

namespace xs::testing {

void expect_close_public(const Host& got, const Host& want, double rtol, double atol, const std::string& what);
Host run_public(const Tensor& t);

namespace {

using Case = std::function<void(std::mt19937&)>;

void exact(const Tensor& t, const Host& want, const std::string& what) {
  expect_close_public(run_public(t), want, 0, 0, what);
}

Host ref_gather(const Host& x, int64_t axis, const Host& idx) {
  Host out{idx.shape, x.dtype, {}};
  for (int64_t i = 0; i < numel(idx.shape); ++i) {
    std::vector<int64_t> c = coords_of(i, idx.shape);
    c[axis] = static_cast<int64_t>(idx.v[i]);
    out.v.push_back(x.v[flat_of(c, x.shape)]);
  }
  return out;
}

// Naive layer norm over the last axis and its gradients, straight from the definitions:
// y = xhat * gamma + beta; dx = (1/D) rstd (D g - sum g - xhat sum(g xhat)), g = dy * gamma.
struct LayerNormRef {
  Host y, dx, dgamma;
};

LayerNormRef ref_layer_norm(const Host& x, const Host& gamma, const Host& beta, const Host& dy, double eps) {
  const int64_t d = x.shape.back(), rows = numel(x.shape) / d;
  LayerNormRef r{{x.shape, x.dtype, {}}, {x.shape, x.dtype, {}}, {gamma.shape, x.dtype, std::vector<double>(d, 0)}};
  for (int64_t i = 0; i < rows; ++i) {
    const double* row = &x.v[i * d];
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mean += row[j] / d;
    for (int64_t j = 0; j < d; ++j) var += (row[j] - mean) * (row[j] - mean) / d;
    const double rstd = 1 / std::sqrt(var + eps);
    double g_sum = 0, gx_sum = 0;
    for (int64_t j = 0; j < d; ++j) {
      const double xhat = (row[j] - mean) * rstd, g = dy.v[i * d + j] * gamma.v[j];
      r.y.v.push_back(xhat * gamma.v[j] + beta.v[j]);
      g_sum += g;
      gx_sum += g * xhat;
      r.dgamma.v[j] += dy.v[i * d + j] * xhat;
    }
    for (int64_t j = 0; j < d; ++j) {
      const double xhat = (row[j] - mean) * rstd;
      r.dx.v.push_back(rstd / d * (d * dy.v[i * d + j] * gamma.v[j] - g_sum - xhat * gx_sum));
    }
  }
  return r;
}

Host ref_matmul(const Host& a, const Host& b, bool ta, bool tb) {
  auto at = [](const Host& h, const std::vector<int64_t>& batch, int64_t r, int64_t c, bool t) {
    std::vector<int64_t> full(batch.end() - (h.shape.size() - 2), batch.end());
    for (size_t d = 0; d < full.size(); ++d) if (h.shape[d] == 1) full[d] = 0;
    full.push_back(t ? c : r);
    full.push_back(t ? r : c);
    return h.v[flat_of(full, h.shape)];
  };
  const size_t ra = a.shape.size(), rb = b.shape.size();
  const int64_t m = a.shape[ra - (ta ? 1 : 2)], k = a.shape[ra - (ta ? 2 : 1)], n = b.shape[rb - (tb ? 2 : 1)];
  Shape batch = broadcast_shapes(Shape(a.shape.begin(), a.shape.end() - 2), Shape(b.shape.begin(), b.shape.end() - 2), "ref");
  Shape os = batch;
  os.push_back(m);
  os.push_back(n);
  Host out{os, a.dtype, std::vector<double>(numel(os))};
  for (int64_t i = 0; i < numel(os); ++i) {
    std::vector<int64_t> c = coords_of(i, os);
    std::vector<int64_t> bc(c.begin(), c.end() - 2);
    double s = 0;
    for (int64_t p = 0; p < k; ++p) s += at(a, bc, c[os.size() - 2], p, ta) * at(b, bc, p, c[os.size() - 1], tb);
    out.v[i] = round_to(s, a.dtype);
  }
  return out;
}

Host ref_conv(const Host& x, const Host& w, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], wd = x.shape[3], o = w.shape[0], kh = w.shape[2], kw = w.shape[3];
  const int64_t oh = (h + 2 * ph - kh) / sh + 1, ow = (wd + 2 * pw - kw) / sw + 1;
  Host out{{n, o, oh, ow}, x.dtype, {}};
  for (int64_t b = 0; b < n; ++b) for (int64_t oc = 0; oc < o; ++oc) for (int64_t y = 0; y < oh; ++y) for (int64_t xx = 0; xx < ow; ++xx) {
    double s = 0;
    for (int64_t ci = 0; ci < c; ++ci) for (int64_t i = 0; i < kh; ++i) for (int64_t j = 0; j < kw; ++j) {
      const int64_t iy = y * sh - ph + i, ix = xx * sw - pw + j;
      if (iy >= 0 && iy < h && ix >= 0 && ix < wd) s += x.v[((b * c + ci) * h + iy) * wd + ix] * w.v[((oc * c + ci) * kh + i) * kw + j];
    }
    out.v.push_back(round_to(s, x.dtype));
  }
  return out;
}

Host ref_pool(const Host& x, bool is_max, int64_t k, int64_t s, int64_t p) {
  const int64_t planes = x.shape[0] * x.shape[1], h = x.shape[2], w = x.shape[3];
  const int64_t oh = (h + 2 * p - k) / s + 1, ow = (w + 2 * p - k) / s + 1;
  Host out{{x.shape[0], x.shape[1], oh, ow}, x.dtype, {}};
  for (int64_t pl = 0; pl < planes; ++pl) for (int64_t y = 0; y < oh; ++y) for (int64_t xx = 0; xx < ow; ++xx) {
    double acc = is_max ? -INFINITY : 0;
    for (int64_t i = 0; i < k; ++i) for (int64_t j = 0; j < k; ++j) {
      const int64_t iy = y * s - p + i, ix = xx * s - p + j;
      if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
      const double v = x.v[(pl * h + iy) * w + ix];
      acc = is_max ? std::max(acc, v) : acc + v;
    }
    out.v.push_back(round_to(is_max ? acc : acc / (k * k), x.dtype));
  }
  return out;
}

// A world-size-2 communicator over one process: the "other replica" holds the same values,
// so sum doubles them, mean and max leave them.
class MirrorCommunicator : public Communicator {
 public:
  int ordinal() const override { return 0; }
  int world_size() const override { return 2; }
  void all_reduce(void* data, size_t n, DType dtype, ReduceOp op) override {
    ++calls;
    if (op != ReduceOp::kSum) return;
    for (size_t i = 0; i < n; ++i) store_element(data, dtype, i, 2 * load_element(data, dtype, i));
  }
  void broadcast(void*, size_t, DType, int) override {}
  void all_gather(const void*, void*, size_t, DType) override {}
  void reduce_scatter(const void*, void*, size_t, DType, ReduceOp) override {}
  void barrier() override {}
  std::vector<std::vector<std::byte>> rendezvous(const std::string&, std::span<const std::byte>) override { return {}; }
  int calls = 0;
};

// Naive adjoints: loop over every (output, window tap) pair and accumulate.
Host ref_conv_grads(const Host& x, const Host& w, const Host& g, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                    Host* gw) {
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], wd = x.shape[3], o = w.shape[0], kh = w.shape[2], kw = w.shape[3];
  const int64_t oh = g.shape[2], ow = g.shape[3];
  Host gi{x.shape, x.dtype, std::vector<double>(x.v.size(), 0)};
  *gw = Host{w.shape, w.dtype, std::vector<double>(w.v.size(), 0)};
  for (int64_t b = 0; b < n; ++b) for (int64_t oc = 0; oc < o; ++oc) for (int64_t y = 0; y < oh; ++y) for (int64_t xx = 0; xx < ow; ++xx) {
    const double gv = g.v[((b * o + oc) * oh + y) * ow + xx];
    for (int64_t ci = 0; ci < c; ++ci) for (int64_t i = 0; i < kh; ++i) for (int64_t j = 0; j < kw; ++j) {
      const int64_t iy = y * sh - ph + i, ix = xx * sw - pw + j;
      if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
      const int64_t xi = ((b * c + ci) * h + iy) * wd + ix, wi = ((oc * c + ci) * kh + i) * kw + j;
      gi.v[xi] += gv * w.v[wi];
      gw->v[wi] += gv * x.v[xi];
    }
  }
  return gi;
}

Host ref_pool_grad(const Host& x, const Host& g, bool is_max, int64_t k, int64_t s, int64_t p) {
  const int64_t planes = x.shape[0] * x.shape[1], h = x.shape[2], w = x.shape[3], oh = g.shape[2], ow = g.shape[3];
  Host out{x.shape, x.dtype, std::vector<double>(x.v.size(), 0)};
  for (int64_t pl = 0; pl < planes; ++pl) for (int64_t y = 0; y < oh; ++y) for (int64_t xx = 0; xx < ow; ++xx) {
    const double gv = g.v[(pl * oh + y) * ow + xx];
    int64_t best = -1;
    for (int64_t i = 0; i < k; ++i) for (int64_t j = 0; j < k; ++j) {
      const int64_t iy = y * s - p + i, ix = xx * s - p + j;
      if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
      const int64_t at = (pl * h + iy) * w + ix;
      if (!is_max) out.v[at] += gv / (k * k);
      else if (best < 0 || x.v[at] > x.v[best]) best = at;
    }
    if (is_max && best >= 0) out.v[best] += gv;
  }
  for (double& v : out.v) v = round_to(v, x.dtype);
  return out;
}

void gradient_cases(std::map<Op, Case>& c) {
  c[Op::kConv2dGradInput] = c[Op::kConv2dGradWeight] = [](std::mt19937& rng) {
    for (auto [sh, sw, ph, pw] : std::vector<std::array<int64_t, 4>>{{1, 1, 0, 0}, {1, 2, 1, 0}, {2, 2, 1, 1}}) {
      const Host x = random_host({2, 3, 7, 6}, DType::kF64, rng), w = random_host({4, 3, 3, 2}, DType::kF64, rng);
      const int64_t oh = (7 + 2 * ph - 3) / sh + 1, ow = (6 + 2 * pw - 2) / sw + 1;
      const Host g = random_host({2, 4, oh, ow}, DType::kF64, rng);
      Host gw;
      const Host gi = ref_conv_grads(x, w, g, sh, sw, ph, pw, &gw);
      const std::string what = fmt::format("stride {}x{} pad {}x{}", sh, sw, ph, pw);
      expect_close_public(run_public(conv2d_grad_input(to_tensor(g), to_tensor(w), {sh, sw}, {ph, pw}, {7, 6})), gi,
                          1e-12, 1e-12, "conv2d_grad_input " + what);
      expect_close_public(run_public(conv2d_grad_weight(to_tensor(x), to_tensor(g), {sh, sw}, {ph, pw}, {3, 2})), gw,
                          1e-12, 1e-12, "conv2d_grad_weight " + what);
    }
  };
  c[Op::kMaxPool2dGrad] = c[Op::kAvgPool2dGrad] = [](std::mt19937& rng) {
    for (auto [k, s, p] : std::vector<std::array<int64_t, 3>>{{2, 2, 0}, {3, 2, 1}, {3, 1, 1}}) {
      const Host x = random_host({2, 3, 7, 7}, DType::kF32, rng);
      const int64_t o = (7 + 2 * p - k) / s + 1;
      const Host g = random_host({2, 3, o, o}, DType::kF32, rng);
      const std::string what = fmt::format(" k {} s {} p {}", k, s, p);
      expect_close_public(run_public(max_pool2d_grad(to_tensor(x), to_tensor(g), {k, k}, {s, s}, {p, p})),
                          ref_pool_grad(x, g, true, k, s, p), 1e-6, 1e-6, "max_pool2d_grad" + what);
      expect_close_public(run_public(avg_pool2d_grad(to_tensor(g), {7, 7}, {k, k}, {s, s}, {p, p})),
                          ref_pool_grad(x, g, false, k, s, p), 1e-5, 1e-6, "avg_pool2d_grad" + what);
    }
  };
  c[Op::kScatterAdd] = [](std::mt19937& rng) {
    const Host src = random_host({4, 3}, DType::kF32, rng);
    const Host idx{{4, 3}, DType::kI64, {0, 4, 4, 1, 1, 1, 4, 0, 2, 3, 3, 3}};
    Host want{{4, 5}, DType::kF32, std::vector<double>(20, 0)};
    for (int i = 0; i < 12; ++i) want.v[(i / 3) * 5 + static_cast<int>(idx.v[i])] += src.v[i];
    for (double& v : want.v) v = round_to(v, DType::kF32);
    expect_close_public(run_public(scatter_add(to_tensor(idx), to_tensor(src), 1, {4, 5})), want, 1e-6, 1e-6,
                        "scatter_add axis 1 (repeated indices accumulate)");
  };
}

void random_cases(std::map<Op, Case>& c) {
  auto stats = [](Op op, const Tensor& t, double want_mean, double want_std) {
    const std::vector<double> v = run_public(t).v;
    double m = 0, s2 = 0;
    for (double x : v) m += x;
    m /= v.size();
    for (double x : v) s2 += (x - m) * (x - m);
    const double sd = std::sqrt(s2 / v.size());
    EXPECT_NEAR(m, want_mean, 0.03) << op_name(op);
    EXPECT_NEAR(sd, want_std, 0.03) << op_name(op);
    if (op == Op::kRandUniform) {
      for (double x : v) ASSERT_TRUE(x >= 0 && x < 1) << x;
    }
  };
  auto seed = [](int64_t s) { return Tensor::from_vector<int64_t>(std::vector<int64_t>{s}, {}); };
  c[Op::kRandUniform] = [=](std::mt19937&) {
    stats(Op::kRandUniform, rand_uniform({100, 200}), 0.5, std::sqrt(1.0 / 12));
    // Counter-based: the first elements do not depend on the shape; the seed decides all.
    const Host a = run_public(rand_uniform({10}, DType::kF64, seed(7)));
    const Host b = run_public(rand_uniform({4, 5}, DType::kF64, seed(7)));
    const Host d = run_public(rand_uniform({10}, DType::kF64, seed(8)));
    for (int i = 0; i < 10; ++i) EXPECT_EQ(a.v[i], b.v[i]);
    EXPECT_NE(a.v, d.v);
    EXPECT_EQ(run_public(rand_uniform({0, 3})).v.size(), 0u);
  };
  c[Op::kRandNormal] = [=](std::mt19937&) { stats(Op::kRandNormal, rand_normal({100, 200}, DType::kF64), 0, 1); };
  c[Op::kBernoulli] = [=](std::mt19937&) {
    const double p = 0.3;
    stats(Op::kBernoulli, bernoulli({100, 200}, p), p, std::sqrt(p * (1 - p)));
    for (double x : run_public(bernoulli({50}, 0.0)).v) EXPECT_EQ(x, 0);
  };
  c[Op::kAllReduce] = [](std::mt19937& rng) {
    const Host x = random_host({3, 5}, DType::kF32, rng);
    exact(all_reduce(to_tensor(x), ReduceOp::kSum), x, "all_reduce without communicator");
    MirrorCommunicator comm;
    runtime().set_communicator(&comm);
    Host twice = x;
    for (double& v : twice.v) v *= 2;
    exact(all_reduce(to_tensor(x), ReduceOp::kSum), twice, "all_reduce sum, world size 2");
    exact(all_reduce(to_tensor(x), ReduceOp::kMax), x, "all_reduce max, world size 2");
    runtime().set_communicator(nullptr);
    EXPECT_EQ(comm.calls, 2);
  };
  // The sharded update's collectives at world size 1 (tests/replica runs them across processes).
  c[Op::kReduceScatter] = [](std::mt19937& rng) {
    const Host x = random_host({6}, DType::kF32, rng);
    exact(reduce_scatter(to_tensor(x), ReduceOp::kMean, 1), x, "reduce_scatter, world size 1");
    EXPECT_THROW(reduce_scatter(to_tensor(x), ReduceOp::kSum, 4), InvalidArgument);
  };
  c[Op::kAllGather] = [](std::mt19937& rng) {
    const Host x = random_host({5}, DType::kF64, rng);
    exact(all_gather(to_tensor(x), 1), x, "all_gather, world size 1");
  };
  c[Op::kShard] = [](std::mt19937& rng) {
    const Host x = random_host({4}, DType::kI32, rng);
    exact(local_shard({to_tensor(x)}, 1), x, "shard, world size 1");
    const Host a = random_host({3}, DType::kF32, rng), b = random_host({5}, DType::kF32, rng);
    Host ab{{8}, DType::kF32, a.v};
    ab.v.insert(ab.v.end(), b.v.begin(), b.v.end());
    exact(local_shard({to_tensor(a), to_tensor(b)}, 1), ab, "shard of two parts, world size 1");
  };
}

}  // namespace

void add_structural_cases(std::map<Op, Case>& c) {
  c[Op::kData] = [](std::mt19937& rng) {
    for (DType d : {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64, DType::kBool}) {
      const Host x = random_host({3, 7}, d, rng);
      expect_close_public(from_tensor(to_tensor(x)), x, 0, 0, "data round trip");
    }
  };
  c[Op::kConst] = [](std::mt19937&) {
    // Pure constants stay pending through mark_step; a host read fills them.
    const Tensor z = Tensor::zeros({2, 3}), o = Tensor::ones({4}, DType::kI32);
    mark_step();
    EXPECT_TRUE(z.is_pending());
    expect_close_public(from_tensor(z), Host{{2, 3}, DType::kF32, std::vector<double>(6, 0)}, 0, 0, "zeros");
    expect_close_public(from_tensor(o), Host{{4}, DType::kI32, std::vector<double>(4, 1)}, 0, 0, "ones");
    exact(Tensor::full({2, 2}, 2.5), Host{{2, 2}, DType::kF32, std::vector<double>(4, 2.5)}, "full 2.5");
    exact(Tensor::zeros({3}) + 1.0, Host{{3}, DType::kF32, std::vector<double>(3, 1)}, "folded 0 + 1");
    expect_close_public(from_tensor(Tensor::full_data({2}, -3, DType::kI64)), Host{{2}, DType::kI64, {-3, -3}}, 0, 0,
                        "full_data");
  };
  c[Op::kWhere] = [](std::mt19937& rng) {
    for (const Shape& s : std::vector<Shape>{{3, 4}, {0, 4}, {5, 1}}) {
      const Host cond = random_host(s, DType::kBool, rng), a = random_host({4}, DType::kF32, rng), b = random_host(s, DType::kF32, rng);
      const Host want = ref_map({&cond, &a, &b}, DType::kF32, [](const auto& v) { return v[0] ? v[1] : v[2]; });
      exact(where(to_tensor(cond), to_tensor(a), to_tensor(b)), want, "where " + shape_str(s));
    }
  };
  c[Op::kCast] = [](std::mt19937& rng) {
    for (DType from : {DType::kF32, DType::kF64, DType::kI32, DType::kBool, DType::kBF16})
      for (DType to : {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64, DType::kBool}) {
        const Host x = random_host({5, 3}, from, rng, -100, 100);
        const Host want = ref_map({&x}, to, [](const auto& v) { return v[0]; });
        exact(cast(to_tensor(x), to), want, fmt::format("cast {} -> {}", dtype_name(from), dtype_name(to)));
      }
  };
  c[Op::kReshape] = [](std::mt19937& rng) {
    const Host x = random_host({3, 4, 5}, DType::kF32, rng);
    exact(reshape(to_tensor(x), {5, -1}), Host{{5, 12}, DType::kF32, x.v}, "reshape");
    exact(reshape(to_tensor(Host{{0, 2}, DType::kF32, {}}), {2, 0}), Host{{2, 0}, DType::kF32, {}}, "reshape empty");
  };
  c[Op::kPermute] = [](std::mt19937& rng) {
    const Host x = random_host({2, 3, 5}, DType::kI32, rng);
    Host want{{5, 2, 3}, DType::kI32, {}};
    for (int64_t i = 0; i < 30; ++i) {
      const auto cc = coords_of(i, want.shape);
      want.v.push_back(x.v[flat_of({cc[1], cc[2], cc[0]}, x.shape)]);
    }
    exact(permute(to_tensor(x), {2, 0, 1}), want, "permute");
    exact(transpose(transpose(to_tensor(x), 0, 2), 0, 2), x, "transpose twice");
  };
  c[Op::kSlice] = [](std::mt19937& rng) {
    const Host x = random_host({6, 7}, DType::kF64, rng);
    Host want{{6, 2}, DType::kF64, {}};
    for (int64_t r = 0; r < 6; ++r) for (int64_t k = 1; k < 5; k += 3) want.v.push_back(x.v[r * 7 + k]);
    exact(slice(to_tensor(x), 1, 1, 5, 3), want, "slice step 3");
    exact(slice(to_tensor(x), 0, 2, 2), Host{{0, 7}, DType::kF64, {}}, "empty slice");
  };
  c[Op::kConcat] = [](std::mt19937& rng) {
    const Host a = random_host({2, 3}, DType::kF32, rng), b = random_host({2, 1}, DType::kF32, rng), e{{2, 0}, DType::kF32, {}};
    Host want{{2, 4}, DType::kF32, {}};
    for (int r = 0; r < 2; ++r) {
      for (int k = 0; k < 3; ++k) want.v.push_back(a.v[r * 3 + k]);
      want.v.push_back(b.v[r]);
    }
    exact(concat({to_tensor(a), to_tensor(e), to_tensor(b)}, 1), want, "concat axis 1");
  };
  c[Op::kBroadcast] = [](std::mt19937& rng) {
    const Host x = random_host({3, 1}, DType::kBF16, rng);
    const Host target{{2, 3, 4}, DType::kBF16, std::vector<double>(24)};
    exact(broadcast_to(to_tensor(x), {2, 3, 4}), ref_map({&x, &target}, DType::kBF16, [](const auto& v) { return v[0]; }),
          "broadcast");
  };
  c[Op::kPad] = [](std::mt19937& rng) {
    const Host x = random_host({2, 3}, DType::kF32, rng);
    Host want{{3, 6}, DType::kF32, std::vector<double>(18, -1)};
    for (int r = 0; r < 2; ++r) for (int k = 0; k < 3; ++k) want.v[(r + 1) * 6 + k + 2] = x.v[r * 3 + k];
    exact(pad(to_tensor(x), {1, 0, 2, 1}, -1), want, "pad");
  };
  c[Op::kMatmul] = [](std::mt19937& rng) {
    const std::vector<std::pair<Shape, Shape>> shapes = {{{3, 4}, {4, 5}}, {{17, 33}, {33, 9}}, {{2, 3, 4}, {4, 5}},
                                                        {{2, 1, 3, 4}, {3, 4, 2}}, {{3, 0}, {0, 4}}, {{0, 3}, {3, 2}}};
    for (DType d : {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64})
      for (const auto& [sa, sb] : shapes)
        for (int flags = 0; flags < 4; ++flags) {
          Shape ta = sa, tb = sb;
          if (flags & 1) std::swap(ta[ta.size() - 1], ta[ta.size() - 2]);
          if (flags & 2) std::swap(tb[tb.size() - 1], tb[tb.size() - 2]);
          const Host a = random_host(ta, d, rng), b = random_host(tb, d, rng);
          const double tol = d == DType::kBF16 ? 3e-2 : d == DType::kF32 ? 1e-5 : 1e-12;
          expect_close_public(run_public(matmul(to_tensor(a), to_tensor(b), flags & 1, flags & 2)),
                              ref_matmul(a, b, flags & 1, flags & 2), tol, tol,
                              fmt::format("matmul {} {} x {} flags {}", dtype_name(d), shape_str(ta), shape_str(tb), flags));
        }
  };
  c[Op::kConv2d] = [](std::mt19937& rng) {
    for (auto [sh, sw, ph, pw] : std::vector<std::array<int64_t, 4>>{{1, 1, 0, 0}, {1, 2, 1, 0}, {2, 2, 1, 1}}) {
      const Host x = random_host({2, 3, 7, 6}, DType::kF32, rng), w = random_host({4, 3, 3, 2}, DType::kF32, rng);
      expect_close_public(run_public(conv2d(to_tensor(x), to_tensor(w), {sh, sw}, {ph, pw})), ref_conv(x, w, sh, sw, ph, pw),
                          1e-5, 1e-5, fmt::format("conv2d stride {}x{} pad {}x{}", sh, sw, ph, pw));
    }
  };
  for (Op op : {Op::kMaxPool2d, Op::kAvgPool2d}) {
    c[op] = [op](std::mt19937& rng) {
      for (auto [k, s, p] : std::vector<std::array<int64_t, 3>>{{2, 2, 0}, {3, 2, 1}, {3, 1, 1}}) {
        const Host x = random_host({2, 3, 7, 7}, DType::kF32, rng);
        const Tensor t = op == Op::kMaxPool2d ? max_pool2d(to_tensor(x), {k, k}, {s, s}, {p, p}) : avg_pool2d(to_tensor(x), {k, k}, {s, s}, {p, p});
        expect_close_public(run_public(t), ref_pool(x, op == Op::kMaxPool2d, k, s, p), 1e-6, 1e-6,
                            fmt::format("{} k {} s {} p {}", op_name(op), k, s, p));
      }
    };
  }
  c[Op::kGather] = [](std::mt19937& rng) {
    const Host x = random_host({4, 6}, DType::kF32, rng);
    Host i1{{4, 2}, DType::kI64, {5, 0, 1, 1, 3, 2, 0, 5}}, i0{{3, 6}, DType::kI32, {}};
    for (int k = 0; k < 18; ++k) i0.v.push_back(k % 4);
    exact(gather(to_tensor(x), 1, to_tensor(i1)), ref_gather(x, 1, i1), "gather axis 1");
    exact(gather(to_tensor(x), 0, to_tensor(i0)), ref_gather(x, 0, i0), "gather axis 0");
  };
  c[Op::kEmbedding] = [](std::mt19937& rng) {
    const Host table = random_host({6, 5}, DType::kF32, rng);
    const Host idx{{2, 3}, DType::kI32, {5, 0, 5, 2, 1, 0}};
    Host want{{2, 3, 5}, DType::kF32, {}};
    for (double k : idx.v) {
      for (int j = 0; j < 5; ++j) want.v.push_back(table.v[static_cast<int>(k) * 5 + j]);
    }
    exact(embedding(to_tensor(table), to_tensor(idx)), want, "embedding");
    EXPECT_THROW(run_public(embedding(to_tensor(table), to_tensor(Host{{1}, DType::kI64, {6}}))), InvalidArgument)
        << "an index past the table's rows";
  };
  c[Op::kEmbeddingGrad] = [](std::mt19937& rng) {
    const Host g = random_host({4, 3}, DType::kF64, rng);
    const Host idx{{4}, DType::kI64, {2, 0, 2, 2}};
    Host want{{3, 3}, DType::kF64, std::vector<double>(9, 0)};
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 3; ++j) want.v[static_cast<int>(idx.v[i]) * 3 + j] += g.v[i * 3 + j];
    }
    expect_close_public(run_public(embedding_grad(to_tensor(idx), to_tensor(g), 3)), want, 1e-15, 0,
                        "embedding_grad (row 1 untouched, row 2 sums three)");
  };
  c[Op::kLayerNorm] = [](std::mt19937& rng) {
    for (const DType dt : {DType::kF32, DType::kF64}) {
      const double tol = dt == DType::kF32 ? 2e-5 : 1e-12;
      const Host x = random_host({3, 4, 33}, dt, rng), gamma = random_host({33}, dt, rng),
                 beta = random_host({33}, dt, rng);
      const LayerNormRef r = ref_layer_norm(x, gamma, beta, x, 1e-5);
      expect_close_public(run_public(layer_norm(to_tensor(x), to_tensor(gamma), to_tensor(beta), 1e-5)), r.y, tol,
                          tol, fmt::format("layer_norm ({})", dtype_name(dt)));
    }
  };
  c[Op::kLayerNormGrad] = [](std::mt19937& rng) {
    for (const DType dt : {DType::kF32, DType::kF64}) {
      const double tol = dt == DType::kF32 ? 2e-5 : 1e-12;
      const Host x = random_host({5, 17}, dt, rng), gamma = random_host({17}, dt, rng),
                 dy = random_host({5, 17}, dt, rng);
      const LayerNormRef r = ref_layer_norm(x, gamma, gamma, dy, 1e-5);
      const std::string what = fmt::format(" ({})", dtype_name(dt));
      expect_close_public(run_public(layer_norm_grad_input(to_tensor(x), to_tensor(gamma), to_tensor(dy), 1e-5)),
                          r.dx, tol, tol, "layer_norm_grad of x" + what);
      expect_close_public(run_public(layer_norm_grad_gamma(to_tensor(x), to_tensor(gamma), to_tensor(dy), 1e-5)),
                          r.dgamma, tol, tol, "layer_norm_grad of gamma" + what);
    }
  };
  // Naive: exp(x - max) / sum over each row's visible columns (all, or 0..t when causal).
  auto ref_softmax = [](const Host& x, bool causal) {
    const int64_t d = x.shape.back();
    Host y{x.shape, x.dtype, std::vector<double>(x.v.size(), 0)};
    for (int64_t r = 0; r < numel(x.shape) / d; ++r) {
      const int64_t n = causal ? r % d + 1 : d;
      double top = -1e300, total = 0;
      for (int64_t j = 0; j < n; ++j) top = std::max(top, x.v[r * d + j]);
      for (int64_t j = 0; j < n; ++j) total += std::exp(x.v[r * d + j] - top);
      for (int64_t j = 0; j < n; ++j) y.v[r * d + j] = std::exp(x.v[r * d + j] - top) / total;
    }
    return y;
  };
  c[Op::kSoftmax] = [ref_softmax](std::mt19937& rng) {
    for (const bool causal : {false, true}) {
      Host x = random_host({2, 3, 9, 9}, DType::kF32, rng);
      for (double& v : x.v) v *= 40;  // large logits: the shift by the max must keep exp finite
      const Tensor t = to_tensor(x);
      expect_close_public(run_public(causal ? causal_softmax(t) : softmax(t, -1)), ref_softmax(x, causal), 1e-5,
                          1e-7, causal ? "causal_softmax" : "softmax");
    }
  };
  c[Op::kSoftmaxGrad] = [ref_softmax](std::mt19937& rng) {
    for (const bool causal : {false, true}) {
      const Host y = ref_softmax(random_host({4, 6, 6}, DType::kF64, rng), causal);
      const Host g = random_host({4, 6, 6}, DType::kF64, rng);
      Host want{y.shape, y.dtype, std::vector<double>(y.v.size(), 0)};
      for (int64_t r = 0; r < 24; ++r) {
        double dot = 0;
        for (int64_t j = 0; j < 6; ++j) dot += y.v[r * 6 + j] * g.v[r * 6 + j];
        for (int64_t j = 0; j < 6; ++j) want.v[r * 6 + j] = y.v[r * 6 + j] * (g.v[r * 6 + j] - dot);
      }
      expect_close_public(run_public(softmax_grad(to_tensor(y), to_tensor(g), causal)), want, 1e-12, 1e-14,
                          causal ? "softmax_grad causal" : "softmax_grad");
    }
  };
  c[Op::kOneHot] = [](std::mt19937&) {
    const Host idx{{2, 3}, DType::kI64, {0, 6, 3, 3, 1, 5}};
    Host want{{2, 3, 7}, DType::kF32, std::vector<double>(42, 0)};
    for (int i = 0; i < 6; ++i) want.v[i * 7 + static_cast<int>(idx.v[i])] = 1;
    exact(one_hot(to_tensor(idx), 7), want, "one_hot");
  };
  random_cases(c);
  gradient_cases(c);
}

}  // namespace xs::testing
