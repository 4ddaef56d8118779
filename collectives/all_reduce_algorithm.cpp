#include "collectives/all_reduce_algorithm.h"

#include <fmt/format.h>

#include "base/env.h"
#include "base/error.h"

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
  }
  return "?";
}

AllReduceAlgorithm parse_all_reduce_algorithm(std::string_view text, std::string_view what) {
  if (text == "ring") return AllReduceAlgorithm::kRing;
  if (text == "oneshot") return AllReduceAlgorithm::kOneShot;
  if (text == "twoshot") return AllReduceAlgorithm::kTwoShot;
  if (text == "cma") return AllReduceAlgorithm::kCma;
  throw InvalidArgument(fmt::format("{}='{}': expected ring, oneshot, twoshot or cma", what, text));
}

std::optional<AllReduceAlgorithm> all_reduce_algorithm_from_env() {
  const auto text = env_string(kAllReduceAlgorithmEnv);
  if (!text) return std::nullopt;
  return parse_all_reduce_algorithm(*text, kAllReduceAlgorithmEnv);
}

// One-shot below one_shot_max_bytes; above it, CMA when every replica has a core of its
// own and the two-shot when they share cores. Measured with each schedule forced (busbw
// or time, medians; the 2-core machine shared with other work, see the README):
//   for n in 2 4 8; do for a in oneshot twoshot ring cma; do
//     XLA_SPAWN_ALLREDUCE_ALGO=$a all_reduce_sweep --nprocs $n --max-bytes 4194304 --factor 2
//   done; done
//   N = 2: one-shot  2.2 us at  8 KiB vs 8.8;  13.0 vs 11.6 at 16 KiB; 28.6 vs 11.2 at 32 KiB
//          CMA vs two-shot busbw (GB/s): 128 KiB 7.3-10.3 vs 6.5-7.3, 512 KiB 8.6-9.2 vs
//          5.2-7.1, 2 MiB 5.6-8.1 vs 4.4-5.8, 32 MiB 5.6-6.7 vs 6.1-6.2
//   N = 4: one-shot 12.6 us at  8 KiB vs 14.4; 18.1 vs 17.0 at 16 KiB; 25.7 vs 21.2 at 32 KiB
//   N = 8: one-shot 40.6 us at 16 KiB vs 53.4; 62.5 vs 64.9 at 32 KiB; 116 vs 86 at 64 KiB
//          with futex-only waits; with the yield polling of shm/wait.h (two runs each):
//          8 KiB 20.6/34.3 vs 22.6/22.6, 16 KiB 31.2/41.5 vs 28.7/24.9, 32 KiB 51.7 vs 37.8;
//          two-shot vs CMA: 609 vs 789 us at 512 KiB, 2965 vs 2912 at 2 MiB, 5832 vs 7040
//          at 4 MiB (sleeping replicas pay the CMA system calls on the critical path)
// The ring never won (2(N-1) dependent hops per slab) and stays the reference.
size_t one_shot_max_bytes(int world_size) {
  return world_size <= 4 ? (size_t{16} << 10) : (size_t{8} << 10);
}

AllReduceAlgorithm choose_all_reduce_algorithm(size_t bytes, int world_size, bool spinning) {
  if (bytes <= one_shot_max_bytes(world_size)) return AllReduceAlgorithm::kOneShot;
  return spinning ? AllReduceAlgorithm::kCma : AllReduceAlgorithm::kTwoShot;
}

}  // namespace xs
