#pragma once
// Which all-reduce schedule runs: chosen per call from message size and world size, or
// forced with XLA_SPAWN_ALLREDUCE_ALGO=ring|oneshot|twoshot|cma|direct (or
// ShmCommunicatorOptions).
//
//   auto forced = xs::all_reduce_algorithm_from_env();          // nullopt: choose per call
//   xs::AllReduceAlgorithm a = xs::choose_all_reduce_algorithm(bytes, world_size, spinning);

#include <cstddef>
#include <optional>
#include <string_view>

namespace xs {

// kCma: the two-shot over cross-memory attach (process_vm_readv/writev) instead of staging;
// where replicas may not access each other's memory it runs as kTwoShot.
// kDirect: the zero-copy two-shot on operands from Communicator::alloc_buffer (every
// replica's operand in its buffer arena); for other operands it runs as kCma or kTwoShot.
enum class AllReduceAlgorithm { kRing, kOneShot, kTwoShot, kCma, kDirect };
inline constexpr int kNumAllReduceAlgorithms = 5;

inline constexpr const char* kAllReduceAlgorithmEnv = "XLA_SPAWN_ALLREDUCE_ALGO";

std::string_view all_reduce_algorithm_name(AllReduceAlgorithm algorithm);
// Parses "ring", "oneshot", "twoshot", "cma" or "direct"; throws xs::InvalidArgument naming `what`
// otherwise.
AllReduceAlgorithm parse_all_reduce_algorithm(std::string_view text, std::string_view what);
// XLA_SPAWN_ALLREDUCE_ALGO, or nullopt when unset.
std::optional<AllReduceAlgorithm> all_reduce_algorithm_from_env();

// The measured choice for a message of `bytes` among `world_size` replicas, `spinning`
// when they have a core each. Operands elsewhere (`in_arena` false): one-shot up to
// one_shot_max_bytes, then CMA when spinning, else the two-shot. Operands in the buffer
// arena: kDirect from direct_min_bytes up (numbers in all_reduce_algorithm.cpp).
AllReduceAlgorithm choose_all_reduce_algorithm(size_t bytes, int world_size, bool spinning,
                                               bool in_arena = false);
size_t one_shot_max_bytes(int world_size);
size_t direct_min_bytes(bool spinning);

}  // namespace xs
