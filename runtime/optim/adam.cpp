#include "runtime/optim/adam.h"

#include <cmath>

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/ops.h"

namespace xs {

Adam::Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled_weight_decay)
    : Optimizer(std::move(params), options.lr),
      options_(options),
      decoupled_(decoupled_weight_decay) {
  if (!(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1 &&
        options.eps >= 0 && options.weight_decay >= 0)) {
    throw InvalidArgument(
        fmt::format("Adam: betas ({}, {}) must be in [0, 1), eps {} and weight_decay {} >= 0",
                    options.beta1, options.beta2, options.eps, options.weight_decay));
  }
  beta1_ = Tensor::full_data({}, options.beta1);
  one_minus_beta1_ = Tensor::full_data({}, 1 - options.beta1);
  beta2_ = Tensor::full_data({}, options.beta2);
  one_minus_beta2_ = Tensor::full_data({}, 1 - options.beta2);
  eps_ = Tensor::full_data({}, options.eps);
  weight_decay_ = Tensor::full_data({}, options.weight_decay);
  init_state();
}

void Adam::begin_step() {
  const double t = static_cast<double>(steps());
  const double bc1 = 1 - std::pow(options_.beta1, t), bc2 = 1 - std::pow(options_.beta2, t);
  step_size_ = Tensor::full_data({}, lr() / bc1);
  sqrt_bias_correction2_ = Tensor::full_data({}, std::sqrt(bc2));
  decay_ = Tensor::full_data({}, 1 - lr() * options_.weight_decay);
}

void Adam::update(Tensor& param, const Tensor& grad, std::vector<Tensor>& state) {
  Tensor g = grad;
  if (options_.weight_decay != 0 && !decoupled_) g = g + param * weight_decay_;
  Tensor& m = state[0];
  Tensor& v = state[1];
  m.assign(m * beta1_ + g * one_minus_beta1_);
  v.assign(v * beta2_ + square(g) * one_minus_beta2_);
  const Tensor denom = sqrt(v) / sqrt_bias_correction2_ + eps_;
  const Tensor p = (options_.weight_decay != 0 && decoupled_) ? param * decay_ : param;
  param.assign(p - m / denom * step_size_);
}

}  // namespace xs
