#include "xla_spawn/collectives/all_reduce_algorithm.h"

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"

namespace xs {

std::string_view all_reduce_algorithm_name(AllReduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllReduceAlgorithm::kRing:
      return "ring";
    case AllReduceAlgorithm::kOneShot:
      return "oneshot";
    case AllReduceAlgorithm::kTwoShot:
      return "twoshot";
    case AllReduceAlgorithm::kCma:
      return "cma";
    case AllReduceAlgorithm::kDirect:
      return "direct";
  }
  return "?";
}

AllReduceAlgorithm parse_all_reduce_algorithm(std::string_view text, std::string_view what) {
  if (text == "ring") return AllReduceAlgorithm::kRing;
  if (text == "oneshot") return AllReduceAlgorithm::kOneShot;
  if (text == "twoshot") return AllReduceAlgorithm::kTwoShot;
  if (text == "cma") return AllReduceAlgorithm::kCma;
  if (text == "direct") return AllReduceAlgorithm::kDirect;
  throw InvalidArgument(
      fmt::format("{}='{}': expected ring, oneshot, twoshot, cma or direct", what, text));
}

std::optional<AllReduceAlgorithm> all_reduce_algorithm_from_env() {
  const auto text = env_string(kAllReduceAlgorithmEnv);
  if (!text) return std::nullopt;
  return parse_all_reduce_algorithm(*text, kAllReduceAlgorithmEnv);
}

// One-shot up to one_shot_max_bytes; above it, CMA when every replica has a core of its
// own and the two-shot when they share cores. Measured with each schedule forced (time per
// call in us, medians, two runs each; the 2-core machine shared with other work, see
// docs/performance.md), after the one-pass AVX2 reduction kernels
// (collectives/detail/reduce_avx2.h) made the one-shot's N reads per element cheaper:
//   for n in 2 3 4 8; do for a in oneshot twoshot cma; do
//     XLA_SPAWN_ALLREDUCE_ALGO=$a all_reduce_sweep --nprocs $n --min-bytes 8192
//       --max-bytes 524288 --factor 2         (one command line)
//   done; done
//   N = 2: one-shot vs CMA  16 KiB 4.2/4.4 vs 4.6/5.1; 32 KiB 6.9/7.7 vs 6.1/6.4;
//          64 KiB 10.7/9.8 vs 9.4/7.7. CMA vs two-shot: 128 KiB 14.8/10.8 vs 21.3/25.2,
//          512 KiB 47/35 vs 86/81
//   N = 3: one-shot vs two-shot 32 KiB 19.4/20.6 vs 19.1/24.4; 64 KiB 29.7/23.7 vs
//          30.6/29.6; 128 KiB 42.0/43.4 vs 45.3/40.7
//   N = 4: 32 KiB 16.7/19.4 vs 18.2/25.9; 64 KiB 25.0/29.9 vs 38.5/33.0; 128 KiB 78.9/46.4
//          vs 49.9/48.0; 512 KiB 231/265 vs 162/191
//   N = 8: 16 KiB 27.3/26.9 vs 34.5/36.9; 32 KiB 37.8/47.6 vs 55.8/41.0; 64 KiB 62.9/80.6
//          vs 63.9/62.5; 128 KiB 179/171 vs 91/87 (N = 5..7 not measured: as N = 8)
//   At N = 8 CMA lost to the two-shot (2 MiB: 1911-2304 us vs 1704-2009, 128 KiB 143-233
//   vs 81-109): each 4 KiB page of a peer is pinned per system call, and sleeping replicas
//   pay those calls on the critical path.
// The ring never won (2(N-1) dependent hops per slab) and stays the reference.
size_t one_shot_max_bytes(int world_size) {
  if (world_size == 3 || world_size == 4) return size_t{64} << 10;
  return size_t{16} << 10;
}

// Arena operands (XLA_SPAWN_ALLREDUCE_ALGO=oneshot|direct all_reduce_sweep --nprocs N
// --min-bytes 1024 --max-bytes 65536 --factor 2, which allocates its operand with
// alloc_buffer; time per call in us, one-shot vs direct):
//   N = 2: 1 KiB 0.93 vs 0.98, 2 KiB 1.32 vs 1.04, 4 KiB 1.57 vs 0.81, 16 KiB 4.3 vs 1.15
//   N = 8: 2 KiB 10.7 vs 14.1, 4 KiB 14.7 vs 14.3, 8 KiB 20.7 vs 15.4, 64 KiB 92.7 vs 30.3
size_t direct_min_bytes(bool spinning) {
  return spinning ? size_t{2} << 10 : size_t{4} << 10;
}

AllReduceAlgorithm choose_all_reduce_algorithm(size_t bytes, int world_size, bool spinning,
                                               bool in_arena) {
  if (in_arena && bytes >= direct_min_bytes(spinning)) return AllReduceAlgorithm::kDirect;
  if (bytes <= one_shot_max_bytes(world_size)) return AllReduceAlgorithm::kOneShot;
  return spinning ? AllReduceAlgorithm::kCma : AllReduceAlgorithm::kTwoShot;
}

}  // namespace xs
