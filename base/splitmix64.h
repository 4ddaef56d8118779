#pragma once
// splitmix64 (Steele, Lea, Flood 2014): the project's one deterministic 64-bit generator and
// mixing function. The same state gives the same stream on every platform and standard
// library, unlike std:: distributions; data order, parameter initialisation and IR hashing
// all build on it.
//
//   xs::SplitMix64 rng(seed);
//   uint64_t bits = rng.next();
//   uint64_t die = rng.below(6);                       // uniform in [0, 6)
//   uint64_t h = xs::splitmix64_finalize(key);         // bijective 64-bit mix

#include <cstdint>

#include "xla_spawn/base/check.h"

namespace xs {

// 2^64 / golden ratio: splitmix64's increment.
inline constexpr uint64_t kSplitMix64Increment = 0x9e3779b97f4a7c15ull;

// splitmix64's output function: a bijective 64-bit mix (the runtime's generated code repeats
// it from these constants).
inline constexpr uint64_t kSplitMix64Mul1 = 0xbf58476d1ce4e5b9ull, kSplitMix64Mul2 = 0x94d049bb133111ebull;
inline constexpr int kSplitMix64Shift1 = 30, kSplitMix64Shift2 = 27, kSplitMix64Shift3 = 31;
inline uint64_t splitmix64_finalize(uint64_t z) {
  z = (z ^ (z >> kSplitMix64Shift1)) * kSplitMix64Mul1;
  z = (z ^ (z >> kSplitMix64Shift2)) * kSplitMix64Mul2;
  return z ^ (z >> kSplitMix64Shift3);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}

  uint64_t next() {
    state_ += kSplitMix64Increment;
    return splitmix64_finalize(state_);
  }

  // Uniform in [0, bound) without modulo bias; bound > 0.
  uint64_t below(uint64_t bound) {
    XS_CHECK(bound > 0, "SplitMix64::below: bound must be positive");
    // Reject the lowest (2^64 mod bound) values so every residue is equally likely.
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  uint64_t state_;
};

}  // namespace xs
