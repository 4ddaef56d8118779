// Runtime micro-benchmarks (issue 4, acceptance 3). Each result is verified before timing;
// figures are medians of thread CPU time over repetitions, with the runtime and its baseline
// interleaved so load from other processes hits both alike.
//
//   build-rt/bench/runtime/runtime_bench [--csv out.csv] [--quick]
//
// 1. matmul through the lazy runtime (trace, cut, hash, cache lookup, Eigen -> OpenBLAS
//    sgemm) vs cblas_sgemm called directly, GFLOP/s, at MLP shapes and 1024^3.
// 2. an 8-op elementwise chain on 16 Mi floats: one fused loop vs one step per op.
// 3. compile time (compile_graph) of a 1,000-node graph.
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

#include "base/error.h"
#include "runtime/graph.h"
#include "runtime/ops.h"
#include "runtime/program.h"
#include "runtime/runtime.h"

namespace xs {
namespace {

// This thread's CPU time: BLAS is pinned to one thread (the caller's), so CPU time is the
// work done, and time spent descheduled by other processes on a shared machine is excluded.
double now_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times a and b alternately `reps` times; returns their median seconds.
std::pair<double, double> interleaved(int reps, const std::function<void()>& a, const std::function<void()>& b) {
  std::vector<double> ta, tb;
  for (int i = 0; i < reps; ++i) {
    double t0 = now_s();
    a();
    ta.push_back(now_s() - t0);
    t0 = now_s();
    b();
    tb.push_back(now_s() - t0);
  }
  return {median(ta), median(tb)};
}

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

Row bench_chain(int64_t n_elems, int reps) {
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
  const auto [t_fused, t_steps] = interleaved(reps, fused, one_by_one);
  return {fmt::format("8-op chain, {} Mi floats", n_elems >> 20), t_fused * 1e3, t_steps * 1e3, "ms",
          t_steps / t_fused, ">= 3.00"};
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

}  // namespace
}  // namespace xs

int main(int argc, char** argv) {
  using namespace xs;
  std::string csv;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv = argv[++i];
    else if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else {
      std::fprintf(stderr, "usage: %s [--csv out.csv] [--quick]\n", argv[0]);
      return 2;
    }
  }
  ScopedRuntime rt;
  openblas_set_num_threads(1);
  const int r = quick ? 3 : 1;
  std::vector<Row> rows;
  rows.push_back(bench_matmul(128, 784, 512, 60 / r));
  rows.push_back(bench_matmul(128, 512, 512, 60 / r));
  rows.push_back(bench_matmul(1024, 1024, 1024, 15 / r));
  rows.push_back(bench_chain(int64_t{16} << 20, 9 / r));
  rows.push_back(bench_compile(21 / r));
  std::printf("%-52s %12s %12s %-8s %8s  %s\n", "benchmark", "runtime", "baseline", "unit", "ratio", "bar");
  for (const Row& row : rows) {
    std::printf("%-52s %12.3f %12.3f %-8s %8.3f  %s\n", row.name.c_str(), row.runtime, row.baseline,
                row.unit.c_str(), row.ratio, row.bar.c_str());
  }
  if (!csv.empty()) {
    FILE* f = std::fopen(csv.c_str(), "w");
    if (f == nullptr) return 1;
    std::fprintf(f, "benchmark,runtime,baseline,unit,ratio,bar\n");
    for (const Row& row : rows)
      std::fprintf(f, "\"%s\",%.4f,%.4f,%s,%.4f,\"%s\"\n", row.name.c_str(), row.runtime, row.baseline,
                   row.unit.c_str(), row.ratio, row.bar.c_str());
    std::fclose(f);
  }
  return 0;
}
