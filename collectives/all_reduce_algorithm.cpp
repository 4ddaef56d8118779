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

// One-shot below, two-shot from this size on. Measured with each schedule forced
// (XLA_SPAWN_ALLREDUCE_ALGO, best of two sweep medians, 2-core machine under load):
//   for n in 2 4 8; do for a in oneshot twoshot ring cma; do
//     XLA_SPAWN_ALLREDUCE_ALGO=$a all_reduce_sweep --nprocs $n --max-bytes 4194304 --factor 2
//   done; done
//   N = 2: one-shot  2.2 us at  8 KiB vs 8.8;  13.0 vs 11.6 at 16 KiB; 28.6 vs 11.2 at 32 KiB
//   N = 4: one-shot 12.6 us at  8 KiB vs 14.4; 18.1 vs 17.0 at 16 KiB; 25.7 vs 21.2 at 32 KiB
//   N = 8: one-shot 40.6 us at 16 KiB vs 53.4; 62.5 vs 64.9 at 32 KiB; 116 vs 86 at 64 KiB
// The ring never won (2(N-1) dependent hops per slab) and stays the reference; CMA was
// within noise of the two-shot (better at some sizes, worse at others) and needs ptrace
// rights between replicas, so it is only used when forced.
size_t one_shot_max_bytes(int world_size) {
  return world_size <= 4 ? (size_t{16} << 10) : (size_t{32} << 10);
}

AllReduceAlgorithm choose_all_reduce_algorithm(size_t bytes, int world_size) {
  return bytes <= one_shot_max_bytes(world_size) ? AllReduceAlgorithm::kOneShot
                                                 : AllReduceAlgorithm::kTwoShot;
}

}  // namespace xs
