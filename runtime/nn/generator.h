#pragma once
// A seeded random generator for parameter initialisation on the host: the same seed gives the
// same numbers on every run and machine (splitmix64 bits, no std:: distributions, whose
// output is implementation-defined).
//
//   Generator gen(42);
//   float u = gen.uniform(-0.1, 0.1);

#include <cstdint>

#include "xla_spawn/base/splitmix64.h"

namespace xs {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : bits_(seed) {}
  // 64 uniformly distributed bits.
  uint64_t next_u64() { return bits_.next(); }
  // Uniform in [lo, hi), from the top 53 bits.
  double uniform(double lo, double hi);

 private:
  SplitMix64 bits_;
};

}  // namespace xs
