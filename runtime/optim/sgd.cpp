#include "xla_spawn/runtime/optim/sgd.h"

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

SGD::SGD(std::vector<Tensor> params, SgdOptions options)
    : Optimizer(std::move(params), options.lr),
      options_(options),
      momentum_(Tensor::full_data({}, options.momentum)),
      weight_decay_(Tensor::full_data({}, options.weight_decay)) {
  if (options.momentum < 0 || options.weight_decay < 0 ||
      (options.nesterov && options.momentum <= 0)) {
    throw InvalidArgument(fmt::format(
        "SGD: momentum {} and weight_decay {} must be >= 0 (and momentum > 0 for Nesterov)",
        options.momentum, options.weight_decay));
  }
  init_state();
}

std::vector<std::string> SGD::state_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

void SGD::update(Tensor& param, const Tensor& grad, std::vector<Tensor>& state) {
  Tensor g = grad;
  if (options_.weight_decay != 0) g = g + param * weight_decay_;
  if (options_.momentum != 0) {
    Tensor& buf = state[0];
    buf.assign(buf * momentum_ + g);
    g = options_.nesterov ? g + buf * momentum_ : buf;
  }
  param.assign(param - g * lr_tensor());
}

}  // namespace xs
