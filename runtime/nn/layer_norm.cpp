#include "xla_spawn/runtime/nn/layer_norm.h"

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

LayerNorm::LayerNorm(int64_t dim, double eps) : eps_(eps) {
  if (dim < 1 || !(eps > 0)) throw InvalidArgument(fmt::format("LayerNorm: dim {} (>= 1), eps {} (> 0)", dim, eps));
  weight_ = &register_parameter("weight", Tensor::full_data({dim}, 1.0));
  bias_ = &register_parameter("bias", Tensor::full_data({dim}, 0.0));
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, *weight_, *bias_, eps_); }

}  // namespace xs
