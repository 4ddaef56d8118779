#include "xla_spawn/runtime/nn/generator.h"

namespace xs {

double Generator::uniform(double lo, double hi) {
  const double unit = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * unit;
}

}  // namespace xs
