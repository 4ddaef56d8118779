#include "xla_spawn/runtime/nn/dropout.h"

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

Dropout::Dropout(double p) : p_(p) {
  if (!(p >= 0 && p < 1)) throw InvalidArgument(fmt::format("Dropout: p = {} is not in [0, 1)", p));
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0) return x;
  const Tensor keep = bernoulli(x.shape(), 1 - p_, x.dtype());
  return x * keep * (1 / (1 - p_));
}

}  // namespace xs
