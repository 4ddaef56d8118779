// bf16 matrix products and convolutions on oneDNN against the f32 paths (issue 21, acceptance
// 2), side by side in one run. Each engine's result is checked against an f32 reference before
// it is timed; figures are GFLOP/s from medians of thread CPU time over repetitions, the
// engines interleaved so load from other processes hits them alike.
//
//   OPENBLAS_CORETYPE=SkylakeX build/bench/runtime/bf16_gemm_bench [--csv out.csv] [--reps 15]
//       [--filter gemm|conv]
//
// GEMMs, at the MLP's shapes (batch 128, 784-512-512-10: forward, input and weight gradients)
// and the CNN's (per-sample im2col / kernel-row products of conv1 and conv2, the dense
// layers): oneDNN bf16 matmul (the runtime's prepared kernel), OpenBLAS cblas_sgemm, oneDNN
// dnnl_sgemm, and the runtime's bf16 fallback (widen to f32, sgemm, round back).
// Convolutions, the CNN's two layers at batch 128 and 28x28 layers of 3, 8 and 16 input
// channels at batch 32 (where oneDNN's blocked layouts start to pay), forward and both
// gradients: oneDNN bf16 and f32 primitives, in the layouts oneDNN chooses (operands reordered
// in and out, as the runtime runs them) and on the plain NCHW buffers, against the runtime's
// f32 kernels (kernel rows / im2col + GEMM) and its bf16 fallback (widen, f32 kernel, round).
#include <cblas.h>
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench/runtime/timing.h"
#include "xla_spawn/base/dtype.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/kernels/kernels.h"
#include "xla_spawn/runtime/kernels/onednn.h"

namespace xs {
namespace {

using detail::Arg;

std::vector<float> pattern(int64_t n, int salt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 37 + salt * 11) % 97 - 48) / 64.0f;
  return v;
}

std::vector<BF16> to_bf16(const std::vector<float>& v) {
  std::vector<BF16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = BF16::from_float(v[i]);
  return out;
}

// Runs `fn` enough times per repetition (at least 2 ms of work) for the clock to resolve it.
int calls_per_rep(const std::function<void()>& fn) {
  const double t0 = bench::now_s();
  fn();
  const double t = std::max(bench::now_s() - t0, 1e-7);
  return static_cast<int>(std::clamp(2e-3 / t, 1.0, 1000.0));
}

struct Engine {
  std::string name;
  std::function<void()> run;
  std::function<std::vector<float>()> result;  // as f32, after a run
};

struct Row {
  std::string kind, shape, onednn_impl;
  std::vector<double> gflops;  // per engine
};

// Largest |got - want| over the largest |want|.
double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, peak = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(got[i] - want[i])));
    peak = std::max(peak, static_cast<double>(std::fabs(want[i])));
  }
  return err / peak;
}

// Checks every engine against `want` (bf16 engines within 2^-7 of the peak: one rounding of
// each output, f32 sums), then times them interleaved: GFLOP/s of the median repetition.
Row measure(std::string kind, std::string shape, double flop, const std::vector<Engine>& engines,
            const std::vector<float>& want, int reps) {
  std::vector<std::function<void()>> fns;
  std::vector<int> calls;
  for (const Engine& e : engines) {
    e.run();
    const double err = rel_error(e.result(), want);
    if (!(err <= 1.0 / 128))
      throw Error(fmt::format("{} {}: {} is off by {} of the peak", kind, shape, e.name, err));
    calls.push_back(calls_per_rep(e.run));
    fns.push_back([&e, n = calls.back()] {
      for (int i = 0; i < n; ++i) e.run();
    });
  }
  const std::vector<double> t = bench::interleaved(reps, fns);
  Row row{std::move(kind), std::move(shape), "", {}};
  for (size_t i = 0; i < t.size(); ++i) row.gflops.push_back(flop * calls[i] / t[i] / 1e9);
  return row;
}

std::vector<float> widen(const std::vector<BF16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i].to_float();
  return out;
}

const std::vector<std::string> kGemmEngines = {"onednn bf16", "openblas sgemm", "onednn sgemm",
                                               "bf16 convert+sgemm"};

struct GemmShape {
  std::string what;
  int64_t m, n, k;
  bool ta, tb;
};

Row bench_gemm(const GemmShape& g, int reps) {
  const int64_t m = g.m, n = g.n, k = g.k;
  const std::vector<float> a = pattern(m * k, 1), b = pattern(k * n, 2);
  const std::vector<BF16> a16 = to_bf16(a), b16 = to_bf16(b);
  std::vector<float> c(m * n), want(m * n);
  std::vector<BF16> c16(m * n);
  const ValueType at{{g.ta ? k : m, g.ta ? m : k}, DType::kBF16};
  const ValueType bt{{g.tb ? n : k, g.tb ? k : n}, DType::kBF16};
  const ValueType ct{{m, n}, DType::kBF16};
  const Attrs attrs{{}, 0, DType::kF32, (g.ta ? 1 : 0) | (g.tb ? 2 : 0)};
  const auto prepared = detail::make_onednn_matmul(attrs, at, bt, ct);
  if (!prepared) throw Error(fmt::format("oneDNN made no bf16 matmul for {}", g.what));
  const Arg ins[] = {{const_cast<BF16*>(a16.data()), &at}, {const_cast<BF16*>(b16.data()), &bt}};
  const Arg out{c16.data(), &ct};
  const auto to = [](bool t) { return t ? CblasTrans : CblasNoTrans; };
  const int lda = g.ta ? m : k, ldb = g.tb ? k : n;
  const auto sgemm = [&](float* dst) {
    cblas_sgemm(CblasRowMajor, to(g.ta), to(g.tb), m, n, k, 1.0f, a.data(), lda, b.data(), ldb,
                0.0f, dst, n);
  };
  sgemm(want.data());
  const std::vector<Engine> engines = {
      {kGemmEngines[0], [&] { prepared->run(ins, out); }, [&] { return widen(c16); }},
      {kGemmEngines[1], [&] { sgemm(c.data()); }, [&] { return c; }},
      {kGemmEngines[2],
       [&] {
         omp_set_num_threads(1);
         dnnl_sgemm(g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', m, n, k, 1.0f, a.data(), lda, b.data(), ldb,
                    0.0f, c.data(), n);
       },
       [&] { return c; }},
      {kGemmEngines[3], [&] { detail::matmul_kernel(attrs, ins[0], ins[1], out); },
       [&] { return widen(c16); }},
  };
  const std::string shape =
      fmt::format("{}x{}x{}{}{}", m, k, n, g.ta ? " ta" : "", g.tb ? " tb" : "");
  Row row = measure("gemm " + g.what, shape, 2.0 * m * n * k, engines, want, reps);
  row.onednn_impl = prepared->text();
  return row;
}

const std::vector<std::string> kConvEngines = {"onednn bf16", "onednn bf16 plain",
                                               "onednn f32",  "onednn f32 plain",
                                               "runtime f32", "bf16 convert"};

struct ConvShape {
  std::string what;
  int64_t n, c, hw, o, k, pad;
};

Row bench_conv(const ConvShape& s, Op op, int reps) {
  const int64_t ohw = s.hw + 2 * s.pad - s.k + 1;
  const Shape xs{s.n, s.c, s.hw, s.hw}, ws{s.o, s.c, s.k, s.k}, ys{s.n, s.o, ohw, ohw};
  Attrs attrs{{1, 1, s.pad, s.pad}, 0, DType::kF32, 0};
  std::vector<Shape> in_shapes;
  Shape out_shape;
  switch (op) {
    case Op::kConv2d:
      in_shapes = {xs, ws}, out_shape = ys;
      break;
    case Op::kConv2dGradInput:
      in_shapes = {ys, ws}, out_shape = xs, attrs.ints.insert(attrs.ints.end(), {s.hw, s.hw});
      break;
    case Op::kConv2dGradWeight:
      in_shapes = {xs, ys}, out_shape = ws, attrs.ints.insert(attrs.ints.end(), {s.k, s.k});
      break;
    default:
      throw Error("bench_conv: not a convolution");
  }
  std::vector<std::vector<float>> in32;
  std::vector<std::vector<BF16>> in16;
  std::vector<ValueType> t32, t16;
  for (size_t i = 0; i < in_shapes.size(); ++i) {
    in32.push_back(pattern(numel(in_shapes[i]), static_cast<int>(i) + 1));
    in16.push_back(to_bf16(in32.back()));
    t32.push_back({in_shapes[i], DType::kF32});
    t16.push_back({in_shapes[i], DType::kBF16});
  }
  const ValueType o32{out_shape, DType::kF32}, o16{out_shape, DType::kBF16};
  std::vector<float> y32(numel(out_shape)), want;
  std::vector<BF16> y16(numel(out_shape));
  std::vector<Arg> a32, a16;
  for (size_t i = 0; i < in32.size(); ++i) {
    a32.push_back({in32[i].data(), &t32[i]});
    a16.push_back({in16[i].data(), &t16[i]});
  }
  const Arg out32{y32.data(), &o32}, out16{y16.data(), &o16};
  using detail::ConvLayout;
  const auto chosen16 = detail::make_onednn_conv(op, attrs, t16, o16, ConvLayout::kChosen);
  const auto plain16 = detail::make_onednn_conv(op, attrs, t16, o16, ConvLayout::kPlain);
  const auto chosen32 = detail::make_onednn_conv(op, attrs, t32, o32, ConvLayout::kChosen);
  const auto plain32 = detail::make_onednn_conv(op, attrs, t32, o32, ConvLayout::kPlain);
  if (!chosen16 || !plain16 || !chosen32 || !plain32)
    throw Error(fmt::format("oneDNN made no {} primitive for {}", op_name(op), s.what));
  const detail::ExecEnv env;
  detail::run_op_kernel(op, attrs, a32, out32, env);
  want = y32;
  const std::vector<Engine> engines = {
      {kConvEngines[0], [&] { chosen16->run(a16, out16); }, [&] { return widen(y16); }},
      {kConvEngines[1], [&] { plain16->run(a16, out16); }, [&] { return widen(y16); }},
      {kConvEngines[2], [&] { chosen32->run(a32, out32); }, [&] { return y32; }},
      {kConvEngines[3], [&] { plain32->run(a32, out32); }, [&] { return y32; }},
      {kConvEngines[4], [&] { detail::run_op_kernel(op, attrs, a32, out32, env); },
       [&] { return y32; }},
      {kConvEngines[5], [&] { detail::run_op_kernel(op, attrs, a16, out16, env); },
       [&] { return widen(y16); }},
  };
  const std::string shape = fmt::format("x [{},{},{},{}] w [{},{},{},{}] pad {}", s.n, s.c, s.hw,
                                        s.hw, s.o, s.c, s.k, s.k, s.pad);
  const double flop = 2.0 * s.n * s.o * ohw * ohw * s.c * s.k * s.k;
  Row row = measure(fmt::format("{} {}", op_name(op), s.what), shape, flop, engines, want, reps);
  row.onednn_impl = fmt::format("{} / {} / {} / {}", chosen16->text(), plain16->text(),
                                chosen32->text(), plain32->text());
  return row;
}

// One markdown table; `base` is the engine bf16 is compared with.
void print_table(const std::string& title, const std::vector<std::string>& engines,
                 const std::vector<Row>& rows, size_t base) {
  std::printf("\n%s, GFLOP/s (medians)\n\n| what | shape |", title.c_str());
  for (const std::string& e : engines) std::printf(" %s |", e.c_str());
  std::printf(" %s / %s | oneDNN's implementation |\n|---|---|", engines[0].c_str(),
              engines[base].c_str());
  for (size_t i = 0; i < engines.size() + 2; ++i) std::printf("---|");
  std::printf("\n");
  for (const Row& r : rows) {
    std::printf("| %s | %s |", r.kind.c_str(), r.shape.c_str());
    for (double g : r.gflops) std::printf(" %.1f |", g);
    std::printf(" %.2fx | %s |\n", r.gflops[0] / r.gflops[base], r.onednn_impl.c_str());
  }
}

void write_csv(const std::string& path, const std::vector<std::string>& gemm_engines,
               const std::vector<Row>& gemm, const std::vector<std::string>& conv_engines,
               const std::vector<Row>& conv) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw IoError(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
  std::fprintf(f, "kind,shape,engine,gflops\n");
  for (const auto& [engines, rows] :
       {std::pair{&gemm_engines, &gemm}, std::pair{&conv_engines, &conv}})
    for (const Row& r : *rows)
      for (size_t i = 0; i < r.gflops.size(); ++i)
        std::fprintf(f, "%s,%s,%s,%.3f\n", r.kind.c_str(), r.shape.c_str(), (*engines)[i].c_str(),
                     r.gflops[i]);
  std::fclose(f);
}

}  // namespace
}  // namespace xs

int main(int argc, char** argv) {
  using namespace xs;
  std::string csv, filter;
  int reps = 15;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc)
      csv = argv[++i];
    else if (std::strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
      filter = argv[++i];
    else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: %s [--csv out.csv] [--reps n] [--filter gemm|conv]\n", argv[0]);
      return 2;
    }
  }
  detail::init_blas_threads();
  std::printf("OpenBLAS core %s; oneDNN bf16 dot products on this CPU: %s; %d repetitions\n",
              openblas_get_corename(), detail::cpu_has_bf16_dot() ? "yes" : "no (emulated)", reps);
  // Batch 128. MLP 784-512-512-10: forward x W, input gradient g W^T (tb), weight gradient
  // x^T g (ta). CNN: conv1 (1 -> 32, 5x5, pad 2, 28x28) by im2col, per sample W[32][25] x
  // cols[25][784]; conv2 (32 -> 64, 14x14) per sample; dense 3136 -> 1024 -> 10.
  const std::vector<GemmShape> gemms = {
      {"mlp fc1", 128, 512, 784, false, false},
      {"mlp fc2", 128, 512, 512, false, false},
      {"mlp fc3", 128, 10, 512, false, false},
      {"mlp fc1 dW", 784, 512, 128, true, false},
      {"mlp fc2 dW", 512, 512, 128, true, false},
      {"mlp fc3 dW", 512, 10, 128, true, false},
      {"mlp fc2 dx", 128, 512, 512, false, true},
      {"mlp fc3 dx", 128, 512, 10, false, true},
      {"cnn conv1 im2col", 32, 784, 25, false, false},
      {"cnn conv2 im2col", 64, 196, 800, false, false},
      {"cnn conv2 dW", 64, 800, 196, false, true},
      {"cnn conv2 dx", 800, 196, 64, true, false},
      {"cnn fc1", 128, 1024, 3136, false, false},
      {"cnn fc1 dW", 3136, 1024, 128, true, false},
      {"square", 512, 512, 512, false, false},
  };
  const std::vector<ConvShape> convs = {{"cnn conv1", 128, 1, 28, 32, 5, 2},
                                        {"cnn conv2", 128, 32, 14, 64, 5, 2},
                                        {"3 channels", 32, 3, 28, 32, 5, 2},
                                        {"8 channels", 32, 8, 28, 32, 5, 2},
                                        {"16 channels", 32, 16, 28, 32, 5, 2}};
  try {
    std::vector<Row> gemm_rows, conv_rows;
    if (filter.empty() || filter == "gemm")
      for (const GemmShape& g : gemms) gemm_rows.push_back(bench_gemm(g, reps));
    if (filter.empty() || filter == "conv")
      for (const ConvShape& s : convs)
        for (Op op : {Op::kConv2d, Op::kConv2dGradInput, Op::kConv2dGradWeight})
          conv_rows.push_back(bench_conv(s, op, reps));
    if (!gemm_rows.empty()) print_table("Matrix products (m x k x n)", kGemmEngines, gemm_rows, 1);
    if (!conv_rows.empty()) print_table("Convolutions", kConvEngines, conv_rows, 4);
    if (!csv.empty()) write_csv(csv, kGemmEngines, gemm_rows, kConvEngines, conv_rows);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bf16_gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
