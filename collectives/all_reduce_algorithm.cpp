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

// Crossovers measured with scripts/bench-allreduce --algos (see the README table):
// CROSSOVER_PLACEHOLDER
AllReduceAlgorithm choose_all_reduce_algorithm(size_t bytes, int world_size) {
  const size_t one_shot_max_bytes = world_size <= 2 ? (size_t{32} << 10) : (size_t{16} << 10);
  return bytes <= one_shot_max_bytes ? AllReduceAlgorithm::kOneShot : AllReduceAlgorithm::kTwoShot;
}

}  // namespace xs
