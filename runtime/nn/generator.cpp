#include "runtime/nn/generator.h"

namespace xs {

uint64_t Generator::next_u64() {
  // splitmix64 (Steele, Lea, Flood 2014): a full-period 64-bit sequence.
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Generator::uniform(double lo, double hi) {
  const double unit = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * unit;
}

}  // namespace xs
