#include "xla_spawn/runtime/nn/linear.h"

#include <cmath>

#include "xla_spawn/runtime/nn/init.h"
#include "xla_spawn/runtime/autocast.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

Linear::Linear(int64_t in_features, int64_t out_features, Generator& gen, bool bias,
               double init_std) {
  if (init_std > 0) {
    weight_ = &register_parameter("weight", normal_tensor({out_features, in_features}, 0, init_std, gen));
    if (bias) bias_ = &register_parameter("bias", Tensor::full_data({out_features}, 0.0));
    return;
  }
  weight_ =
      &register_parameter("weight", kaiming_uniform({out_features, in_features}, in_features, gen));
  if (bias) {
    const double bound = 1 / std::sqrt(static_cast<double>(in_features));
    bias_ = &register_parameter("bias", uniform_tensor({out_features}, -bound, bound, gen));
  }
}

Tensor Linear::forward(const Tensor& x) {
  const Tensor y = matmul(x, *weight_, false, true);
  return bias_ ? y + detail::bias_like(*bias_, y) : y;
}

}  // namespace xs
