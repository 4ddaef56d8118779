#include "xla_spawn/runtime/loss.h"

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autocast.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

Tensor cross_entropy_per_sample(const Tensor& given, const Tensor& labels) {
  const Tensor logits = detail::autocast_to_f32(given);  // losses run in f32 under autocast
  if (logits.dim() != 2 || labels.dim() != 1 || labels.shape()[0] != logits.shape()[0]) {
    throw InvalidArgument(fmt::format("cross_entropy: logits {} must be [N, C] and labels {} [N]",
                                      type_str(logits.type()), type_str(labels.type())));
  }
  // A one-hot select of log_softmax (elementwise, fuses) rather than gather/scatter on the
  // backward; where() rather than a product, since 0 * -inf (a logit masked with -inf) is NaN.
  const Tensor hot = one_hot(labels, logits.shape()[1], DType::kBool);
  const Tensor picked = where(hot, log_softmax(logits, 1), Tensor::zeros({}, logits.dtype()));
  return -sum(picked, {1});
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  return mean(cross_entropy_per_sample(logits, labels));
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& weight,
                     const Tensor& divisor) {
  if (weight.shape() != Shape{logits.shape().at(0)} || divisor.dim() != 0) {
    throw InvalidArgument(
        fmt::format("cross_entropy: weight {} must be [N] and divisor {} 0-d for logits {}",
                    type_str(weight.type()), type_str(divisor.type()), type_str(logits.type())));
  }
  return sum(cross_entropy_per_sample(logits, labels) * weight) / divisor;
}

Tensor mse_loss(const Tensor& prediction, const Tensor& target) {
  return mean(square(detail::autocast_to_f32(prediction) - detail::autocast_to_f32(target)));
}

}  // namespace xs
