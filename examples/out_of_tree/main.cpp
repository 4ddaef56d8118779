// Each replica builds a tensor from its ordinal, the replicas sum it with an in-graph
// all-reduce, and each checks the job's total: the replica API and the lazy runtime as an
// installed package's user sees them.

#include <cstdlib>
#include <exception>
#include <vector>

#include <fmt/format.h>

#include "xla_spawn/replica/xm.h"
#include "xla_spawn/replica/xm_collectives.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"
#include "xla_spawn/runtime/tensor.h"

int main() try {
  xs::xm::init();
  const int ordinal = xs::xm::ordinal();
  const int n = xs::xm::world_size();
  const xs::Tensor mine = xs::Tensor::full_data({4}, ordinal + 1.0);
  const std::vector<xs::Tensor> reduced =
      xs::xm::all_reduce({xs::mul(mine, mine)}, xs::ReduceOp::kSum);
  xs::mark_step();
  const std::vector<float> got = reduced[0].to_vector<float>();
  const double want = n * (n + 1.0) * (2 * n + 1.0) / 6;  // 1^2 + ... + n^2
  for (float v : got) {
    if (v != want) {
      fmt::print(stderr, "ordinal {}: sum of squares {} instead of {}\n", ordinal, v, want);
      return EXIT_FAILURE;
    }
  }
  fmt::print("ordinal {} of {}: sum of squares {}\n", ordinal, n, got[0]);
  xs::xm::shutdown();
  return EXIT_SUCCESS;
} catch (const std::exception& e) {
  fmt::print(stderr, "sum_replicas: {}\n", e.what());
  return EXIT_FAILURE;
}
