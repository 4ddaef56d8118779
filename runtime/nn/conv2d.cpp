#include "xla_spawn/runtime/nn/conv2d.h"

#include <cmath>

#include "xla_spawn/runtime/nn/init.h"
#include "xla_spawn/runtime/autocast.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, Generator& gen,
               int64_t stride, int64_t padding, bool bias)
    : stride_(stride), padding_(padding) {
  const int64_t fan_in = in_channels * kernel * kernel;
  weight_ = &register_parameter(
      "weight", kaiming_uniform({out_channels, in_channels, kernel, kernel}, fan_in, gen));
  if (bias) {
    const double bound = 1 / std::sqrt(static_cast<double>(fan_in));
    bias_ = &register_parameter("bias", uniform_tensor({out_channels}, -bound, bound, gen));
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  const Tensor y = conv2d(x, *weight_, {stride_, stride_}, {padding_, padding_});
  if (!bias_) return y;
  return y + reshape(detail::bias_like(*bias_, y), {1, bias_->shape()[0], 1, 1});
}

}  // namespace xs
