#pragma once
// 64-bit hash combining for IR nodes and graphs. Not cryptographic: a collision between two
// different graphs would reuse the wrong program, so the mix is strong (splitmix64 finaliser)
// and a program checks its input count and sizes on every run.
//
//   uint64_t h = hash_combine(hash_combine(kSeed, op), operand_hash);

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "xla_spawn/base/splitmix64.h"

namespace xs {

inline constexpr uint64_t kHashSeed = 0x6a09e667f3bcc909ull;  // sqrt(2) fraction bits (SHA-2)

// One splitmix64 step from state x: a strong, bijective mix.
inline uint64_t mix64(uint64_t x) { return splitmix64_finalize(x + kSplitMix64Increment); }

inline uint64_t hash_combine(uint64_t h, uint64_t v) { return mix64(h ^ mix64(v)); }

inline uint64_t hash_double(uint64_t h, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return hash_combine(h, bits);
}

// Folds `bytes` (8 at a time, the last word zero-padded) and their count into `h`.
inline uint64_t hash_bytes(uint64_t h, std::string_view bytes) {
  for (size_t i = 0; i < bytes.size(); i += 8) {
    uint64_t word = 0;
    std::memcpy(&word, bytes.data() + i, std::min<size_t>(8, bytes.size() - i));
    h = hash_combine(h, word);
  }
  return hash_combine(h, bytes.size());
}

}  // namespace xs
