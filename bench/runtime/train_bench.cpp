// Training-step benchmark (issue 5, acceptance 3): one full step through autograd, modules,
// cross-entropy and SGD with momentum, as one compiled graph, against the same step's matrix
// products alone done with direct cblas_sgemm calls at the same shapes (the floor). Medians of
// thread CPU time, step and floor interleaved so machine load hits both alike.
//
//   OPENBLAS_CORETYPE=SkylakeX build-rt/bench/runtime/train_bench [--reps 30] [--filter mlp|cnn]
//       [--only step|floor]   (one side only, for perf)
//
// MLP 784-512-512-10, batch 128: 8 products (3 forward, 3 weight gradients, 2 input
// gradients; the first layer's input gradient is never needed, so never computed). With Adam
// the floor adds the update's memory traffic: it must read parameters, gradients and both
// moments and write parameters and moments (7 passes over 2.7 MB), timed as a memcpy of
// half those bytes (a copy reads and writes each byte), in the same rounds.
// CNN conv5x5(1->32,pad 2)-relu-pool2, conv5x5(32->64,pad 2)-relu-pool2, 3136->128-relu->10,
// batch 128: the runtime's convolutions are per-sample GEMMs (conv1 on its im2col matrix,
// conv2 by kernel rows, 5 GEMMs per product), so the floor is those GEMMs at the same shapes,
// leading dimensions and betas, plus the dense layers' products. Kernel rows trade one GEMM of
// k = 800 per product for 5 of k = 160, which OpenBLAS runs a few percent slower, so the CNN
// is also timed against a second floor with conv2's products at im2col's shapes (the column
// "im2col x": step / that floor), lest a slower floor flatter the ratio. Since f32 convolutions
// of 16 input channels or more run on oneDNN (XLA_SPAWN_CONV=auto), conv2 no longer runs
// these GEMMs: XLA_SPAWN_CONV=runtime gives the like-for-like ratio.
// Plain products in the floor go through the runtime's own GEMM (detail::gemm_f32: OpenBLAS, or
// oneDNN for large ones), as the step's do; accumulating ones and kernel rows call cblas_sgemm
// as the convolution kernels do.
// GPT (train_lm's defaults: 4 blocks, d_model 128, 4 heads, context 128, batch 32, vocabulary
// 64): one AdamW step with in-graph clipping against its 99 products: per block 6 linear layers
// (forward, weight and input gradient) and 6 batched attention products of 128 (batch x head)
// GEMMs each, every one on its own matrices as in the step, plus the head (bar 1.5, issue 17).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "bench/runtime/timing.h"
#include "examples/train_lm/model.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/kernels/kernels.h"
#include "xla_spawn/runtime/loss.h"
#include "xla_spawn/runtime/nn/activation.h"
#include "xla_spawn/runtime/nn/conv2d.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/nn/sequential.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/optim/adam.h"
#include "xla_spawn/runtime/optim/clip_grad.h"
#include "xla_spawn/runtime/optim/sgd.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

// One GEMM of the floor: C[m, n] = op(A) op(B) with inner dimension k, `count` times; with
// `accumulate` every call after the first adds into C (beta = 1), as the runtime's
// convolution weight gradient sums over the batch inside sgemm (beta = 0 would make OpenBLAS
// zero C on every call: work the step does not do).
// A convolution by kernel rows (runtime/kernels/conv_rows.h) is `parts` GEMMs per sample on
// views of one matrix: part i reads A, B and C at i * {a,b,c}_step elements with leading
// dimensions ld{a,b,c} (0: packed), and with `sum_parts` parts after the first add into C.
struct Gemm {
  bool ta, tb;
  int64_t m, n, k, count;
  bool accumulate = false;
  int64_t parts = 1, a_step = 0, b_step = 0, c_step = 0, lda = 0, ldb = 0, ldc = 0;
  bool sum_parts = false;
  bool distinct = false;  // each of the `count` GEMMs on its own A, B and C (a batched matmul)

  int64_t ld_a() const { return lda ? lda : ta ? m : k; }
  int64_t ld_b() const { return ldb ? ldb : tb ? k : n; }
  int64_t ld_c() const { return ldc ? ldc : n; }
  // Elements each operand's buffer spans over all parts.
  int64_t a_size() const { return (parts - 1) * a_step + (ta ? k : m) * ld_a(); }
  int64_t b_size() const { return (parts - 1) * b_step + (tb ? n : k) * ld_b(); }
  int64_t c_size() const { return (parts - 1) * c_step + m * ld_c(); }
};

// A float buffer at a set offset from a page boundary. The runtime's scratch buffers are
// cache-line aligned and start at different offsets mod 4096 (runtime/kernels/linalg.cpp);
// floor operands that were misaligned, or whose A, B and C started at the same offset mod
// 4096 (4K aliasing between the packing loads and the C stores), ran 5-20% slower than the
// step's own GEMMs: a floor slower than the step's products would flatter the ratio.
class AlignedFloats {
 public:
  AlignedFloats(int64_t n, float value, int64_t offset_bytes)
      : base_(static_cast<float*>(std::aligned_alloc(
            4096, (static_cast<size_t>(n) * sizeof(float) + offset_bytes + 4095) / 4096 * 4096))),
        data_(base_.get() + offset_bytes / static_cast<int64_t>(sizeof(float))) {
    if (base_ == nullptr) throw Error(fmt::format("floor buffer of {} floats: out of memory", n));
    std::fill(data_, data_ + n, value);
  }
  float* data() const { return data_; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> base_;
  float* data_;
};

class Floor {
 public:
  // `shared`: every GEMM uses one A, B and C sized for the largest, as the step's products
  // reuse its arena (a floor of 99 GEMMs over 300 MB of their own operands ran a GPT's
  // products from memory, 25% slower than the step's own, flattering the ratio).
  explicit Floor(std::vector<Gemm> gemms, int64_t copy_floats = 0, bool shared = false)
      : gemms_(std::move(gemms)), shared_(shared), copy_from_(copy_floats, 1.0f), copy_to_(copy_floats) {
    int64_t a_max = 0, b_max = 0, c_max = 0;
    for (const Gemm& g : gemms_) {
      const int64_t copies = g.distinct ? g.count : 1;
      a_max = std::max(a_max, g.a_size() * copies);
      b_max = std::max(b_max, g.b_size() * copies);
      c_max = std::max(c_max, g.c_size() * copies);
      if (shared) continue;
      a_.emplace_back(g.a_size() * copies, 0.01f, 45 * 64);
      b_.emplace_back(g.b_size() * copies, 0.02f, 0);
      c_.emplace_back(g.c_size() * copies, 0.0f, 9 * 64);
    }
    if (shared) {
      a_.emplace_back(a_max, 0.01f, 45 * 64);
      b_.emplace_back(b_max, 0.02f, 0);
      c_.emplace_back(c_max, 0.0f, 9 * 64);
    }
  }
  void run() {
    if (!copy_from_.empty()) std::memcpy(copy_to_.data(), copy_from_.data(), copy_from_.size() * sizeof(float));
    for (size_t i = 0; i < gemms_.size(); ++i) {
      const Gemm& g = gemms_[i];
      for (int64_t r = 0; r < g.count; ++r) {
        const int64_t copy = g.distinct ? r : 0;
        const size_t buf = shared_ ? 0 : i;
        float* a = a_[buf].data() + copy * g.a_size();
        float* b = b_[buf].data() + copy * g.b_size();
        float* c = c_[buf].data() + copy * g.c_size();
        for (int64_t part = 0; part < g.parts; ++part) {
          const bool add = (g.accumulate && r > 0) || (g.sum_parts && part > 0);
          // Plain products as the step's matmul does them, through the runtime's GEMM; the
          // convolutions' accumulating and kernel-row GEMMs call OpenBLAS, as their kernels do.
          if (!g.accumulate && g.parts == 1 && g.lda == 0 && g.ldb == 0 && g.ldc == 0) {
            detail::gemm_f32(g.ta, g.tb, g.m, g.n, g.k, a, b, c);
            continue;
          }
          cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans,
                      g.tb ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, 1.0f, a + part * g.a_step,
                      g.ld_a(), b + part * g.b_step, g.ld_b(), add ? 1.0f : 0.0f,
                      c + part * g.c_step, g.ld_c());
        }
      }
    }
  }

 private:
  std::vector<Gemm> gemms_;
  bool shared_;  // one A, B and C for every GEMM
  std::vector<AlignedFloats> a_, b_, c_;
  std::vector<float> copy_from_, copy_to_;  // the memory floor
};

struct Model {
  std::string name;
  std::shared_ptr<Sequential> net;
  Shape input;
  std::vector<Gemm> floor;
  std::vector<Gemm> im2col_floor;  // empty: the floor already has im2col's shapes
  bool adam = false;               // else SGD with momentum
  int64_t copy_floats = 0;         // the floor's memcpy (the optimizer's memory traffic / 2)
};

Model mlp(Generator& gen) {
  auto net = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(784, 512, gen), std::make_shared<ReLU>(),
      std::make_shared<Linear>(512, 512, gen), std::make_shared<ReLU>(),
      std::make_shared<Linear>(512, 10, gen)});
  return {"MLP 784-512-512-10 b128 SGD-momentum step",
          net,
          {128, 784},
          {{false, true, 128, 512, 784, 1},
           {false, true, 128, 512, 512, 1},
           {false, true, 128, 10, 512, 1},
           {true, false, 10, 512, 128, 1},
           {false, false, 128, 512, 10, 1},
           {true, false, 512, 512, 128, 1},
           {false, false, 128, 512, 512, 1},
           {true, false, 512, 784, 128, 1}},
          {}};
}

Model mlp_adam(Generator& gen) {
  Model m = mlp(gen);
  m.name = "MLP 784-512-512-10 b128 Adam step (+ memory floor)";
  m.adam = true;
  int64_t params = 0;
  for (const Tensor& p : m.net->parameters()) params += p.numel();
  m.copy_floats = params * 7 / 2;
  return m;
}

Model cnn(Generator& gen) {
  auto net = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(1, 32, 5, gen, 1, 2), std::make_shared<ReLU>(),
      std::make_shared<MaxPool2d>(2), std::make_shared<Conv2d>(32, 64, 5, gen, 1, 2),
      std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2), std::make_shared<Flatten>(),
      std::make_shared<Linear>(3136, 128, gen), std::make_shared<ReLU>(),
      std::make_shared<Linear>(128, 10, gen)});
  const int64_t b = 128;
  return {"CNN 2x(conv5x5+relu+pool2) 3136-128-10 b128 SGD-momentum step",
          net,
          {b, 1, 28, 28},
          {// conv1: forward, weight gradient (no input gradient: the image needs none)
           {false, false, 32, 784, 25, b},
           {false, true, 32, 25, 784, b, true},
           // conv2 by kernel rows (32 channels x 5 columns = k 160; the row matrix X is
           // 160 x 252, 18 padded rows of 14): per sample 5 GEMMs each for the forward
           // (y += W_i X_i), the weight gradient (dW_i += g X_i^T) and the input gradient
           // (Z_i += W_i^T g)
           {false, false, 64, 196, 160, b, false, 5, 64 * 160, 14, 0, 0, 252, 0, true},
           {false, true, 64, 160, 196, b, true, 5, 0, 14, 64 * 160, 0, 252, 0},
           {true, false, 160, 196, 64, b, false, 5, 64 * 160, 0, 14, 0, 0, 252, true},
           // dense layers: forward, weight gradient, input gradient
           {false, true, b, 128, 3136, 1},
           {true, false, 128, 3136, b, 1},
           {false, false, b, 3136, 128, 1},
           {false, true, b, 10, 128, 1},
           {true, false, 10, 128, b, 1},
           {false, false, b, 128, 10, 1}},
          // the same with conv2 on its 800 x 196 im2col matrix: one GEMM per product
          {{false, false, 32, 784, 25, b},
           {false, true, 32, 25, 784, b, true},
           {false, false, 64, 196, 800, b},
           {false, true, 64, 800, 196, b, true},
           {true, false, 800, 196, 64, b},
           {false, true, b, 128, 3136, 1},
           {true, false, 128, 3136, b, 1},
           {false, false, b, 3136, 128, 1},
           {false, true, b, 10, 128, 1},
           {true, false, 10, 128, b, 1},
           {false, false, b, 128, 10, 1}}};
}

struct Result {
  double step_ms, floor_ms, im2col_floor_ms;  // im2col_floor_ms 0: no second floor
  int64_t uncached, cached;
};

// --only step|floor runs just one side (the other is a no-op), for perf record / perf stat.
enum class Only { kBoth, kStep, kFloor };

Result bench_model(const Model& model, int reps, Only only) {
  std::vector<float> x(numel(model.input));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f;
  const int64_t batch = model.input[0];
  std::vector<int64_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = (i * 7) % 10;
  const Tensor xt = Tensor::from_vector<float>(x, model.input);
  const Tensor yt = Tensor::from_vector<int64_t>(labels, {batch});
  std::unique_ptr<Optimizer> opt;
  if (model.adam) opt = std::make_unique<Adam>(model.net->parameters(), AdamOptions{.lr = 1e-3});
  else opt = std::make_unique<SGD>(model.net->parameters(), SgdOptions{.lr = 0.01, .momentum = 0.9});
  Tensor loss;
  auto step = [&] {
    loss = cross_entropy((*model.net)(xt), yt);
    backward(loss);
    opt->step();
    opt->zero_grad();
    mark_step();
  };
  step();
  const double first = loss.item();
  for (int i = 0; i < 3; ++i) step();
  if (!(loss.item() < first))
    throw Error(fmt::format("{}: loss did not fall ({} -> {})", model.name, first, loss.item()));
  Floor floor(model.floor, model.copy_floats);
  std::vector<std::function<void()>> sides{[&] {
                                             if (only != Only::kFloor) step();
                                           },
                                           [&] {
                                             if (only != Only::kStep) floor.run();
                                           }};
  Floor im2col_floor(model.im2col_floor);
  if (!model.im2col_floor.empty())
    sides.push_back([&] {
      if (only != Only::kStep) im2col_floor.run();
    });
  const std::vector<double> t = bench::interleaved(reps, sides);
  const Metrics& m = runtime().metrics();
  return {t[0] * 1e3, t[1] * 1e3, t.size() > 2 ? t[2] * 1e3 : 0.0,
          m.counter(kCounterUncachedCompile), m.counter(kCounterCachedCompile)};
}

// train_lm's step at its defaults on random tokens, and the floor of its products. A linear
// layer x W^T (x [M, in]) has gradients g W and g^T x; attention's q k^T and p v have
// dq = ds k, dk = ds^T q, dp = dy v^T and dv = p^T dy, each over batch x heads matrices.
Result bench_gpt(int reps, Only only) {
  const lm::GptConfig c{.vocab = 64};
  const int64_t batch = 32, t = c.context, m = batch * t, d = c.d_model, f = 4 * d, dh = d / c.heads;
  const int64_t bh = batch * c.heads;
  std::vector<Gemm> floor;
  auto linear = [&](int64_t in, int64_t out) {
    floor.push_back({false, true, m, out, in, 1});
    floor.push_back({true, false, out, in, m, 1});
    floor.push_back({false, false, m, in, out, 1});
  };
  auto batched = [&](bool ta, bool tb, int64_t rows, int64_t cols, int64_t inner) {
    Gemm g{ta, tb, rows, cols, inner, bh};
    g.distinct = true;
    floor.push_back(g);
  };
  for (int64_t l = 0; l < c.layers; ++l) {
    for (int i = 0; i < 4; ++i) linear(d, d);  // q, k, v, attention projection
    linear(d, f);
    linear(f, d);
    batched(false, true, t, t, dh);    // s = q k^T
    batched(false, false, t, dh, t);   // y = p v
    batched(false, false, t, dh, t);   // dq = ds k
    batched(true, false, t, dh, t);    // dk = ds^T q
    batched(false, true, t, t, dh);    // dp = dy v^T
    batched(true, false, t, dh, t);    // dv = p^T dy
  }
  linear(d, c.vocab);
  lm::Gpt model(c, 0);
  std::vector<int64_t> tokens(static_cast<size_t>(m)), next(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    tokens[i] = static_cast<int64_t>((i * 2654435761u) % 64);
    next[i] = static_cast<int64_t>(((i + 1) * 2654435761u) % 64);
  }
  const Tensor x = Tensor::from_vector<int64_t>(tokens, {batch, t});
  const Tensor y = Tensor::from_vector<int64_t>(next, {m});
  AdamW opt(model.parameters(), AdamOptions{.lr = 1e-3});
  Tensor loss;
  auto step = [&] {
    loss = cross_entropy(model(x), y);
    backward(loss);
    clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    mark_step();
  };
  step();
  const double first = loss.item();
  for (int i = 0; i < 3; ++i) step();
  if (!(loss.item() < first)) throw Error(fmt::format("GPT: loss did not fall ({} -> {})", first, loss.item()));
  Floor gemms(floor, 0, true);
  const std::vector<double> ts = bench::interleaved(reps, {[&] {
                                                          if (only != Only::kFloor) step();
                                                        },
                                                        [&] {
                                                          if (only != Only::kStep) gemms.run();
                                                        }});
  const Metrics& mt = runtime().metrics();
  return {ts[0] * 1e3, ts[1] * 1e3, 0.0, mt.counter(kCounterUncachedCompile), mt.counter(kCounterCachedCompile)};
}

}  // namespace
}  // namespace xs

int main(int argc, char** argv) {
  using namespace xs;
  int reps = 30;
  std::string filter;
  Only only = Only::kBoth;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
      filter = argv[++i];
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc &&
             std::strcmp(argv[i + 1], "step") == 0)
      only = Only::kStep, ++i;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc &&
             std::strcmp(argv[i + 1], "floor") == 0)
      only = Only::kFloor, ++i;
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--filter mlp|cnn|gpt] [--only step|floor]\n",
                   argv[0]);
      return 2;
    }
  }
  openblas_set_num_threads(1);
  std::printf("OpenBLAS core: %s\n", openblas_get_corename());
  std::printf("%-64s %10s %10s %7s %9s  %-8s %9s\n", "benchmark", "step ms", "gemm ms", "ratio",
              "compiles", "bar", "im2col x");
  for (const auto& [key, make] :
       std::vector<std::pair<std::string, Model (*)(Generator&)>>{{"mlp", mlp}, {"mlp", mlp_adam}, {"cnn", cnn}}) {
    if (!filter.empty() && filter != key) continue;
    ScopedRuntime rt;
    Generator gen(0);
    const Model model = make(gen);
    const Result r = bench_model(model, key == "cnn" ? std::max(3, reps / 3) : reps, only);
    const std::string im2col_ratio =
        r.im2col_floor_ms > 0 ? fmt::format("{:.3f}", r.step_ms / r.im2col_floor_ms) : "-";
    std::printf("%-64s %10.3f %10.3f %7.3f %4lld+%-4lld  <= 1.15  %9s\n", model.name.c_str(),
                r.step_ms, r.floor_ms, r.step_ms / r.floor_ms, static_cast<long long>(r.uncached),
                static_cast<long long>(r.cached), im2col_ratio.c_str());
  }
  if (filter.empty() || filter == "gpt") {
    ScopedRuntime rt;
    const Result r = bench_gpt(std::max(3, reps / 3), only);
    std::printf("%-64s %10.3f %10.3f %7.3f %4lld+%-4lld  <= 1.5   %9s\n",
                "GPT L4-D128-H4 32x128 tokens AdamW + clip step", r.step_ms, r.floor_ms,
                r.step_ms / r.floor_ms, static_cast<long long>(r.uncached), static_cast<long long>(r.cached), "-");
  }
  return 0;
}
