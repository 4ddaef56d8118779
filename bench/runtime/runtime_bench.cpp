// Runtime micro-benchmarks (issue 4, acceptance 3). Each result is verified before timing;
// figures are medians of thread CPU time over repetitions, with the runtime and its baseline
// interleaved so load from other processes hits both alike.
//
//   build-rt/bench/runtime/runtime_bench [--csv out.csv] [--quick] [--filter matmul|chain|softmax|reduce|compile|norm|mlp|tiny]
//
// 1. matmul through the lazy runtime (trace, cut, hash, cache lookup, OpenBLAS
//    sgemm) vs cblas_sgemm called directly, GFLOP/s, at MLP shapes and 1024^3.
// 2. an 8-op elementwise chain on 16 Mi floats: one fused loop vs one step per op, and vs a
//    memcpy of the bytes the fused loop moves.
// 3. the GPT's causal softmax ([32, 4, 128, 128], a kernel of its own, not a fused loop) vs a
//    memcpy of the bytes it reads and writes.
// 4. compile time (compile_graph) of a 1,000-node graph.
// 5. an MLP 784-512-512-10 training step (hand-written gradients) vs its 8 sgemm calls.
// 6. a reduction joining its operand's loop (sum((x - y)^2), a conv bias gradient) vs its
//    operand stored and summed by the next step.
// 7. cold compile of a clipping norm over 250, 1,000 and 4,000 tensors, codegen included, vs
//    the compiler's passes alone.
// 8. tiny loops (1, 16 and 256 elements): a loop's time native vs interpreted.
#include <cblas.h>

#include <algorithm>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "xla_spawn/base/error.h"
#include "bench/runtime/timing.h"
#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/compiler/compile.h"
#include "xla_spawn/runtime/program.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

using bench::interleaved;
using bench::median;
using bench::now_s;

std::vector<float> pattern(int64_t n, int salt) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(((i * 2654435761u + salt) % 1000) / 1000.0 - 0.5);
  return v;
}

struct Row {
  std::string name;
  double runtime, baseline;
  std::string unit;
  double ratio;
  std::string bar;
};

Row bench_matmul(int64_t m, int64_t k, int64_t n, int reps) {
  const Tensor a = Tensor::from_vector<float>(pattern(m * k, 1), {m, k});
  const Tensor b = Tensor::from_vector<float>(pattern(k * n, 2), {k, n});
  const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
  std::vector<float> c(m * n);
  auto direct = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, av.data(), k, bv.data(), n, 0.0f,
                c.data(), n);
  };
  auto lazy = [&] {
    Tensor out = matmul(a, b);
    mark_step();
  };
  direct();
  Tensor check = matmul(a, b);
  mark_step();
  const std::vector<float> got = check.to_vector<float>();
  double max_err = 0;
  for (int64_t i = 0; i < m * n; ++i) max_err = std::max(max_err, static_cast<double>(std::abs(got[i] - c[i])));
  if (max_err > 1e-3) throw Error(fmt::format("matmul {}x{}x{}: runtime differs from sgemm by {}", m, k, n, max_err));
  const auto [t_rt, t_blas] = interleaved(reps, lazy, direct);
  const double flop = 2.0 * m * n * k;
  return {fmt::format("matmul {}x{}x{}", m, k, n), flop / t_rt / 1e9, flop / t_blas / 1e9, "GFLOP/s",
          t_blas / t_rt, ">= 0.90"};
}

// x -> ((((x * s1 + s2) relu) * s3 - s4) abs + s5) * s6: 8 elementwise ops.
Tensor chain_op(int i, const Tensor& x, const std::vector<Tensor>& s) {
  switch (i) {
    case 0: return x * s[0];
    case 1: return x + s[1];
    case 2: return relu(x);
    case 3: return x * s[2];
    case 4: return x - s[3];
    case 5: return abs(x);
    case 6: return x + s[4];
    default: return x * s[5];
  }
}

// Two rows: the fused chain against its ops one by one, and against a memcpy of the bytes the
// fused loop must move (read n floats, write n floats), timed in the same rounds.
std::vector<Row> bench_chain(int64_t n_elems, int reps) {
  const Tensor x = Tensor::from_vector<float>(pattern(n_elems, 3), {n_elems});
  std::vector<Tensor> s;
  for (double v : {1.5, 0.25, 0.75, 0.125, 0.5, 2.0}) s.push_back(Tensor::scalar(v));
  Tensor fused_out, step_out;
  auto fused = [&] {
    Tensor y = x;
    for (int i = 0; i < 8; ++i) y = chain_op(i, y, s);
    mark_step();
    fused_out = y;
  };
  auto one_by_one = [&] {
    Tensor y = x;
    for (int i = 0; i < 8; ++i) {
      y = chain_op(i, y, s);
      mark_step();
    }
    step_out = y;
  };
  fused();
  one_by_one();
  if (runtime().last_stats().kernels != 1) throw Error("chain: the one-by-one step should be a single kernel");
  if (fused_out.to_vector<float>() != step_out.to_vector<float>()) throw Error("chain: fused and one-by-one differ");
  std::vector<float> from(static_cast<size_t>(n_elems), 1.0f), to(static_cast<size_t>(n_elems));
  auto copy = [&] { std::memcpy(to.data(), from.data(), from.size() * sizeof(float)); };
  const std::vector<double> t = interleaved(reps, {fused, one_by_one, copy});
  const std::string name = fmt::format("8-op chain, {} Mi floats", n_elems >> 20);
  return {{name, t[0] * 1e3, t[1] * 1e3, "ms", t[1] / t[0], ">= 3.00"},
          {name + " vs memcpy", t[0] * 1e3, t[2] * 1e3, "ms", t[2] / t[0], ">= 0.70 (issue 16)"}};
}

// sum((x - y)^2) over n floats: the reduction in the loop that computes the squares (one
// step) against the squares stored by one step and summed by the next (the unfused form, the
// same values bit for bit), and against a memcpy of the bytes the fused loop must read.
std::vector<Row> bench_reduce(int64_t n_elems, int reps) {
  const Tensor x = Tensor::from_vector<float>(pattern(n_elems, 3), {n_elems});
  const Tensor y = Tensor::from_vector<float>(pattern(n_elems, 5), {n_elems});
  Tensor fused_out, split_out;
  auto fused = [&] {
    fused_out = sum(square(x - y));
    mark_step();
  };
  auto split = [&] {
    Tensor d = square(x - y);
    mark_step();
    split_out = sum(d);
    mark_step();
  };
  fused();
  if (runtime().last_stats().fused_reductions != 1) throw Error("reduce: the sum should join the squares' loop");
  split();
  if (fused_out.item() != split_out.item()) throw Error("reduce: fused and split sums differ");
  std::vector<float> from(static_cast<size_t>(n_elems), 1.0f), to(static_cast<size_t>(n_elems));
  auto copy = [&] { std::memcpy(to.data(), from.data(), from.size() * sizeof(float)); };
  const std::vector<double> t = interleaved(reps, {fused, split, copy});
  const std::string name = fmt::format("sum((x-y)^2), {} Mi floats", n_elems >> 20);
  return {{name, t[0] * 1e3, t[1] * 1e3, "ms", t[1] / t[0], "-"},
          {name + " vs memcpy", t[0] * 1e3, t[2] * 1e3, "ms", t[2] / t[0], "-"}};
}

// A conv bias gradient: g = dy * (x > 0) over `shape` (NCHW; stored: the weight gradient
// reads it too), summed over N, H and W in the loop that computes g (one step) against g
// stored by one step and summed by the next (reduce_kernel, same bits).
Row bench_bias_grad(const Shape& shape, int reps) {
  ScopedRuntime rt;  // its own warm-up: the steps before are bench_reduce's
  const int64_t n = numel(shape);
  const Tensor x = Tensor::from_vector<float>(pattern(n, 3), shape);
  const Tensor dy = Tensor::from_vector<float>(pattern(n, 5), shape);
  const Tensor zero = Tensor::scalar(0.0);
  Tensor fused_g, fused_out, split_out;
  auto fused = [&] {
    fused_g = dy * cast(gt(x, zero), DType::kF32);
    fused_out = sum(fused_g, {0, 2, 3});
    mark_step();
  };
  auto split = [&] {
    Tensor g = dy * cast(gt(x, zero), DType::kF32);
    mark_step();
    split_out = sum(g, {0, 2, 3});
    mark_step();
  };
  fused();
  if (runtime().last_stats().fused_reductions != 1) throw Error("bias grad: the sum should join g's loop");
  split();
  if (fused_out.to_vector<float>() != split_out.to_vector<float>()) throw Error("bias grad: fused and split sums differ");
  const std::vector<double> t = interleaved(reps, {fused, split});
  return {fmt::format("conv bias gradient, sum over N, H, W of {}", shape), t[0] * 1e3, t[1] * 1e3, "ms", t[1] / t[0], "-"};
}

// Tiny loops: 256 independent loops of `n` elements (p * 0.9 + q, each its own loop) as one
// program, compiled with native code and without, the two programs run in turn (Program::run
// alone: no tracing); per loop.
Row bench_tiny_loops(int64_t n, int reps) {
  constexpr int kLoops = 256;
  std::vector<NodePtr> roots;
  std::vector<Tensor> keep;
  for (int i = 0; i < kLoops; ++i) {
    const Tensor p = Tensor::from_vector<float>(pattern(n, i), {n});
    const Tensor q = Tensor::from_vector<float>(pattern(n, i + 1), {n});
    keep.push_back(p * 0.9 + q);
    roots.push_back(keep.back().ir());
  }
  const Graph g = cut_graph(roots, false);
  std::shared_ptr<Program> native = compile_graph(g, {.alias_views = true, .codegen = true});
  std::shared_ptr<Program> interpreted = compile_graph(g, {.alias_views = true, .codegen = false});
  if (native->stats.native_loops != kLoops || interpreted->stats.native_loops != 0) throw Error("tiny loops: not one loop each");
  const detail::ExecEnv env;
  auto run = [&](Program& program) { return [&] { program.run(g.inputs, env); }; };
  const std::vector<BufferPtr> a = native->run(g.inputs, env), b = interpreted->run(g.inputs, env);
  for (int i = 0; i < kLoops; ++i) {
    if (std::memcmp(a[i]->data(), b[i]->data(), static_cast<size_t>(n) * sizeof(float)) != 0) throw Error("tiny loops: results differ");
  }
  const std::vector<double> t = interleaved(reps, {run(*native), run(*interpreted)});
  return {fmt::format("256 loops of {} elements, native vs interpreted, per loop", n), t[0] / kLoops * 1e6,
          t[1] / kLoops * 1e6, "us", t[1] / t[0], "-"};
}

// train_lm's attention scores, one layer: batch 32, 4 heads, 128 x 128 (2 Mi floats), against
// a memcpy of the bytes the kernel must move (read them, write the probabilities). Every row
// is checked against a softmax in double first. The exp of the valid half dominates: with one
// element at a time (exp not vectorised) this read 0.10-0.15 of the memcpy, vectorised 0.3-0.5.
Row bench_softmax(int reps) {
  constexpr int64_t kBatch = 32 * 4, kT = 128, n = kBatch * kT * kT;
  std::vector<float> values = pattern(n, 7);
  for (float& v : values) v *= 8;  // scores of a few units, as attention's
  const Tensor x = Tensor::from_vector<float>(values, {32, 4, kT, kT});
  Tensor y = causal_softmax(x);
  mark_step();
  const std::vector<float> got = y.to_vector<float>();
  double max_err = 0;
  for (int64_t row = 0; row < kBatch * kT; ++row) {
    const float* in = values.data() + row * kT;
    const int64_t valid = row % kT + 1;
    const double top = *std::max_element(in, in + valid);
    double total = 0;
    for (int64_t j = 0; j < valid; ++j) total += std::exp(static_cast<double>(in[j]) - top);
    for (int64_t j = 0; j < kT; ++j) {
      const double want = j < valid ? std::exp(static_cast<double>(in[j]) - top) / total : 0.0;
      max_err = std::max(max_err, std::abs(got[row * kT + j] - want));
    }
  }
  if (max_err > 1e-6) throw Error(fmt::format("causal softmax differs from a double reference by {}", max_err));
  auto lazy = [&] {
    Tensor out = causal_softmax(x);
    mark_step();
  };
  std::vector<float> from(static_cast<size_t>(n), 1.0f), to(static_cast<size_t>(n));
  auto copy = [&] { std::memcpy(to.data(), from.data(), from.size() * sizeof(float)); };
  const auto [t_rt, t_copy] = interleaved(reps, lazy, copy);
  return {"causal softmax [32, 4, 128, 128] vs memcpy", t_rt * 1e3, t_copy * 1e3, "ms", t_copy / t_rt,
          ">= 0.20"};
}

Row bench_compile(int reps) {
  const Tensor w = Tensor::from_vector<float>(pattern(16 * 16, 4), {16, 16});
  const Tensor b = Tensor::from_vector<float>(pattern(16, 5), {16});
  const Tensor half = Tensor::scalar(0.5);
  Tensor h = Tensor::from_vector<float>(pattern(8 * 16, 6), {8, 16});
  Tensor total = Tensor::zeros({});
  for (int i = 0; i < 143; ++i) {  // 7 nodes per block: 1,001 op nodes
    h = tanh(matmul(h, w) + b) * half + h;
    total = total + sum(h);
  }
  const Graph g = cut_graph(std::vector<NodePtr>{h.ir(), total.ir()}, false);
  std::vector<double> t_compile, t_cut;
  for (int i = 0; i < reps; ++i) {
    double t0 = now_s();
    std::shared_ptr<Program> p = compile_graph(g);
    t_compile.push_back(now_s() - t0);
    t0 = now_s();
    const Graph again = cut_graph(std::vector<NodePtr>{h.ir(), total.ir()}, false);
    t_cut.push_back(now_s() - t0);
    if (again.hash != g.hash) throw Error("compile: hash not stable");
  }
  mark_step();  // the compiled program must also run and give a finite result
  if (!std::isfinite(total.item())) throw Error("compile: graph result is not finite");
  return {fmt::format("compile {}-node graph (cut+hash in baseline column)", g.nodes.size()),
          median(t_compile) * 1e3, median(t_cut) * 1e3, "ms", median(t_compile) * 1e3, "< 20 ms"};
}

// A clipping norm over many parameter tensors: sum over i of sum(p_i * p_i), each tensor's
// own fused reduction, then one scalar sum of `params` values. A cold compile (codegen
// included, no cache) against the compiler's passes alone (codegen off) in the baseline column.
Row bench_compile_norm(int64_t params, int reps) {
  std::vector<Tensor> ps;
  for (int64_t i = 0; i < params; ++i) ps.push_back(Tensor::from_vector<float>(pattern(24, static_cast<int>(i)), {4, 6}));
  Tensor total = Tensor::zeros({});
  for (const Tensor& p : ps) total = total + sum(p * p);
  const Graph g = cut_graph(std::vector<NodePtr>{total.ir()}, false);
  std::vector<double> t_cold, t_passes;
  for (int i = 0; i < reps; ++i) {
    double t0 = now_s();
    std::shared_ptr<Program> p = compile_graph(g, {.alias_views = true, .codegen = true});
    t_cold.push_back(now_s() - t0);
    t0 = now_s();
    p = compile_graph(g, {.alias_views = true, .codegen = false});
    t_passes.push_back(now_s() - t0);
  }
  mark_step();
  if (!std::isfinite(total.item())) throw Error("compile norm: result is not finite");
  return {fmt::format("compile a norm over {} tensors (passes in baseline)", params), median(t_cold) * 1e3,
          median(t_passes) * 1e3, "ms", median(t_cold) / median(t_passes), ""};
}

// One training step of an MLP 784-512-512-10 (batch 128): forward, softmax cross-entropy,
// hand-written backward (autograd is the next issue) and SGD with momentum, as one graph;
// against the step's 8 matrix products done with direct sgemm calls (the floor).
struct Layer {
  Tensor w, b, vw, vb;
};

Row bench_mlp_step(int reps) {
  const int64_t batch = 128;
  const std::vector<int64_t> dims = {784, 512, 512, 10};
  std::vector<Layer> layers;
  for (size_t l = 0; l + 1 < dims.size(); ++l) {
    const int64_t in = dims[l], out = dims[l + 1];
    std::vector<float> w = pattern(in * out, static_cast<int>(l));
    for (float& v : w) v *= 0.1f;
    layers.push_back({Tensor::from_vector<float>(w, {in, out}), Tensor::full_data({out}, 0),
                      Tensor::full_data({in, out}, 0), Tensor::full_data({out}, 0)});
  }
  const Tensor x = Tensor::from_vector<float>(pattern(batch * 784, 9), {batch, 784});
  std::vector<int64_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = (i * 7) % 10;
  const Tensor target = one_hot(Tensor::from_vector<int64_t>(labels, {batch}), 10);
  const Tensor lr = Tensor::scalar(0.01), momentum = Tensor::scalar(0.9);
  mark_step();  // materialise the one-hot targets, as a data loader would hand them over
  Tensor loss;
  auto step = [&] {
    std::vector<Tensor> acts = {x};
    for (size_t l = 0; l < layers.size(); ++l) {
      const Tensor z = matmul(acts.back(), layers[l].w) + layers[l].b;
      acts.push_back(l + 1 < layers.size() ? relu(z) : z);
    }
    const Tensor logp = log_softmax(acts.back(), 1);
    loss = mean(neg(sum(target * logp, {1})));
    Tensor grad = (exp(logp) - target) / static_cast<double>(batch);
    for (size_t l = layers.size(); l-- > 0;) {
      const Tensor gw = matmul(acts[l], grad, true, false), gb = sum(grad, {0});
      if (l > 0) grad = where(gt(acts[l], Tensor::scalar(0)), matmul(grad, layers[l].w, false, true), Tensor::scalar(0));
      Layer& L = layers[l];
      L.vw.assign(L.vw * momentum + gw);
      L.vb.assign(L.vb * momentum + gb);
      L.w.assign(L.w - L.vw * lr);
      L.b.assign(L.b - L.vb * lr);
    }
    mark_step();
  };
  // The floor: the step's 8 products (3 forward; dW of every layer and dX of the upper two
  // backward), with direct sgemm at the same shapes.
  std::vector<std::vector<float>> buf(16, std::vector<float>(784 * 512));
  auto gemms = [&] {
    auto g = [&](bool ta, bool tb, int64_t m, int64_t n, int64_t k, int a, int b, int c) {
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f,
                  buf[a].data(), ta ? m : k, buf[b].data(), tb ? k : n, 0.0f, buf[c].data(), n);
    };
    g(false, false, 128, 512, 784, 0, 1, 2);  // x W1
    g(false, false, 128, 512, 512, 2, 3, 4);  // h1 W2
    g(false, false, 128, 10, 512, 4, 5, 6);   // h2 W3
    g(true, false, 512, 10, 128, 4, 6, 7);    // dW3 = h2^T g
    g(false, true, 128, 512, 10, 6, 5, 8);    // dh2 = g W3^T
    g(true, false, 512, 512, 128, 2, 8, 9);   // dW2 = h1^T g
    g(false, true, 128, 512, 512, 8, 3, 10);  // dh1 = g W2^T
    g(true, false, 784, 512, 128, 0, 10, 11); // dW1 = x^T g
  };
  step();
  const double first = loss.item();
  for (int i = 0; i < 3; ++i) step();
  if (!(loss.item() < first)) throw Error(fmt::format("mlp: loss did not fall ({} -> {})", first, loss.item()));
  if (runtime().metrics().counter(kCounterUncachedCompile) != 2) throw Error("mlp: the step compiled more than once");
  const int64_t before = runtime().metrics().counter(kCounterUncachedCompile);
  const auto [t_step, t_gemm] = interleaved(reps, step, gemms);
  if (runtime().metrics().counter(kCounterUncachedCompile) != before) throw Error("mlp: the step recompiled");
  return {"MLP 784-512-512-10 b128 step (manual grads)", t_step * 1e3, t_gemm * 1e3, "ms", t_step / t_gemm, "<= 1.15 (issue 5)"};
}

}  // namespace
}  // namespace xs

int main(int argc, char** argv) {
  using namespace xs;
  std::string csv, filter;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv = argv[++i];
    else if (std::strcmp(argv[i], "--filter") == 0 && i + 1 < argc) filter = argv[++i];
    else if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else {
      std::fprintf(stderr, "usage: %s [--csv out.csv] [--quick] [--filter matmul|chain|softmax|reduce|compile|norm|mlp|tiny]\n", argv[0]);
      return 2;
    }
  }
  openblas_set_num_threads(1);
  const int r = quick ? 3 : 1;
  using Rows = std::vector<Row>;
  const std::vector<std::pair<std::string, std::function<Rows()>>> benches = {
      {"matmul", [&] { return Rows{bench_matmul(128, 784, 512, 60 / r)}; }},
      {"matmul", [&] { return Rows{bench_matmul(128, 512, 512, 60 / r)}; }},
      {"matmul", [&] { return Rows{bench_matmul(1024, 1024, 1024, 15 / r)}; }},
      {"chain", [&] { return bench_chain(int64_t{16} << 20, 9 / r); }},
      {"softmax", [&] { return Rows{bench_softmax(30 / r)}; }},
      {"reduce", [&] {
         Rows rows = bench_reduce(int64_t{16} << 20, 9 / r);
         for (const Shape& shape : {Shape{32, 64, 28, 28}, Shape{128, 128, 7, 7}, Shape{4096, 512, 1, 1}}) {
           rows.push_back(bench_bias_grad(shape, std::max(1, 15 / r)));
         }
         return rows;
       }},
      {"compile", [&] { return Rows{bench_compile(21 / r)}; }},
      {"mlp", [&] { return Rows{bench_mlp_step(30 / r)}; }},
      {"tiny", [&] { return Rows{bench_tiny_loops(1, 200 / r), bench_tiny_loops(16, 200 / r), bench_tiny_loops(256, 200 / r)}; }},
      {"norm", [&] { return Rows{bench_compile_norm(250, std::max(1, 5 / r)), bench_compile_norm(1000, std::max(1, 3 / r)), bench_compile_norm(4000, 1)}; }},
  };
  std::vector<Row> rows;
  for (const auto& [kind, run] : benches) {
    if (!filter.empty() && kind != filter) continue;
    ScopedRuntime rt;  // fresh cache and counters per benchmark
    for (Row& row : run()) rows.push_back(std::move(row));
  }
  std::printf("%-52s %12s %12s %-8s %8s  %s\n", "benchmark", "runtime", "baseline", "unit", "ratio", "bar");
  for (const Row& row : rows) {
    std::printf("%-52s %12.3f %12.3f %-8s %8.3f  %s\n", row.name.c_str(), row.runtime, row.baseline,
                row.unit.c_str(), row.ratio, row.bar.c_str());
  }
  if (!csv.empty()) {
    FILE* f = std::fopen(csv.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", csv.c_str());
      return 1;
    }
    std::fprintf(f, "benchmark,runtime,baseline,unit,ratio,bar\n");
    for (const Row& row : rows)
      std::fprintf(f, "\"%s\",%.4f,%.4f,%s,%.4f,\"%s\"\n", row.name.c_str(), row.runtime, row.baseline,
                   row.unit.c_str(), row.ratio, row.bar.c_str());
    std::fclose(f);
  }
  return 0;
}
