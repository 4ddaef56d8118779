// Would overlapping the gradient exchange with the backward pass (DDP's buckets) pay off in a
// multi-node job? A replica program run under xla-spawn on every node: it times, interleaved,
// (a) compute alone: the MLP 784-512-512-10 training step's eight GEMMs at batch 128 (the
// products a step runs), repeated --gemm-steps times; (b) the network alone: the all-reduce of
// the MLP's 669,706 gradients through the job's communicator; (c) both at once, the all-reduce
// on a second thread while this one computes. If (c) is near max(a, b) the backward could hide
// the network; if it is near a + b, the two compete for the same core (TCP's copies are CPU
// work) and starting collectives early cannot help. Medians over --reps rounds; ordinal 0
// prints the verdict. Single-threaded BLAS, as every replica runs.
//
//   xla-spawn --nnodes 2 --node-rank K --master-addr A -n 1 -- overlap_probe --reps 30

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/replica/xm_collectives.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Gemm {
  bool ta, tb;
  int m, n, k;
};

// The MLP step's products (batch 128): forward, weight gradients, input gradients.
constexpr Gemm kStep[] = {{false, true, 128, 512, 784},  {false, true, 128, 512, 512},
                          {false, true, 128, 10, 512},   {true, false, 10, 512, 128},
                          {false, false, 128, 512, 10},  {true, false, 512, 512, 128},
                          {false, false, 128, 512, 512}, {true, false, 512, 784, 128}};
constexpr size_t kGradients = 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10;

void compute(int steps, std::vector<float>& a, std::vector<float>& b, std::vector<float>& c) {
  for (int s = 0; s < steps; ++s) {
    for (const Gemm& g : kStep) {
      cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans,
                  g.m, g.n, g.k, 1.0f, a.data(), g.ta ? g.m : g.k, b.data(), g.tb ? g.k : g.n, 0.0f,
                  c.data(), g.n);
    }
  }
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 30;
  int gemm_steps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--reps") reps = static_cast<int>(xs::parse_int(argv[i + 1], 3, 10000, "--reps"));
    if (flag == "--gemm-steps") {
      gemm_steps = static_cast<int>(xs::parse_int(argv[i + 1], 1, 1000, "--gemm-steps"));
    }
  }
  xs::xm::init();
  xs::Communicator& comm = xs::xm::communicator();
  std::vector<float> a(784 * 512, 0.5f), b(784 * 512, 0.25f), c(784 * 512);
  auto* grads = static_cast<float*>(comm.alloc_buffer(kGradients * sizeof(float)));
  std::fill(grads, grads + kGradients, 1.0f);
  std::vector<double> alone_compute, alone_network, both;
  for (int r = 0; r < reps + 3; ++r) {  // 3 warm-up rounds: contexts, page faults
    comm.barrier();
    auto start = Clock::now();
    compute(gemm_steps, a, b, c);
    const double t_compute = ms_since(start);
    comm.barrier();
    start = Clock::now();
    comm.all_reduce(grads, kGradients, xs::DType::kF32, xs::ReduceOp::kMean);
    const double t_network = ms_since(start);
    comm.barrier();
    start = Clock::now();
    std::thread exchange(
        [&] { comm.all_reduce(grads, kGradients, xs::DType::kF32, xs::ReduceOp::kMean); });
    compute(gemm_steps, a, b, c);
    exchange.join();
    const double t_both = ms_since(start);
    if (r < 3) continue;
    alone_compute.push_back(t_compute);
    alone_network.push_back(t_network);
    both.push_back(t_both);
  }
  comm.free_buffer(grads);
  const double tc = median(alone_compute), tn = median(alone_network), tb = median(both);
  const std::vector<double> all = xs::xm::all_gather(std::vector<double>{tc, tn, tb});
  if (xs::xm::is_master()) {
    for (int k = 0; k < xs::xm::world_size(); ++k) {
      std::printf("ordinal %d: compute %.2f ms, network %.2f ms, both at once %.2f ms: %.2f of the "
                  "sum, %.2f of the larger\n",
                  k, all[3 * k], all[3 * k + 1], all[3 * k + 2],
                  all[3 * k + 2] / (all[3 * k] + all[3 * k + 1]),
                  all[3 * k + 2] / std::max(all[3 * k], all[3 * k + 1]));
    }
  }
  return 0;
}
