#include "xla_spawn/runtime/nn/batch_norm.h"

#include <algorithm>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

BatchNorm2d::BatchNorm2d(int64_t channels, double eps, double momentum)
    : channels_(channels), eps_(eps), momentum_(momentum) {
  // full_data, not ones/zeros: materialised from the start, so step 1 traces the same graph.
  weight_ = &register_parameter("weight", Tensor::full_data({channels}, 1));
  bias_ = &register_parameter("bias", Tensor::full_data({channels}, 0));
  running_mean_ = &register_buffer("running_mean", Tensor::full_data({channels}, 0));
  running_var_ = &register_buffer("running_var", Tensor::full_data({channels}, 1));
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  if (x.dim() != 4 || x.shape()[1] != channels_) {
    throw InvalidArgument(fmt::format("BatchNorm2d({}): input {} is not [N, {}, H, W]", channels_,
                                      type_str(x.type()), channels_));
  }
  const Shape per_channel{1, channels_, 1, 1};
  Tensor mean_c, var_c;
  if (is_training()) {
    mean_c = mean(x, {0, 2, 3}, true);
    var_c = mean(square(x - mean_c), {0, 2, 3}, true);
    const double n = static_cast<double>(x.numel() / channels_);
    NoGradGuard no_grad;
    const Tensor m = reshape(detach(mean_c), {channels_}), v = reshape(detach(var_c), {channels_});
    running_mean_->assign(*running_mean_ * (1 - momentum_) + m * momentum_);
    running_var_->assign(*running_var_ * (1 - momentum_) +
                         v * (momentum_ * n / std::max(n - 1, 1.0)));
  } else {
    mean_c = reshape(*running_mean_, per_channel);
    var_c = reshape(*running_var_, per_channel);
  }
  const Tensor scale = reshape(*weight_, per_channel) * rsqrt(var_c + eps_);
  return (x - mean_c) * scale + reshape(*bias_, per_channel);
}

}  // namespace xs
