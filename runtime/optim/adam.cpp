#include "xla_spawn/runtime/optim/adam.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

std::vector<bool> decay_matrices_only(const std::vector<Tensor>& params) {
  std::vector<bool> decay;
  for (const Tensor& p : params) decay.push_back(p.dim() >= 2);
  return decay;
}

Adam::Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled_weight_decay,
           std::vector<bool> decay)
    : Optimizer(std::move(params), options.lr),
      options_(options),
      decoupled_(decoupled_weight_decay),
      masked_(std::find(decay.begin(), decay.end(), false) != decay.end()) {
  if (!decay.empty() && decay.size() != params_.size()) {
    throw InvalidArgument(fmt::format("Adam: {} weight-decay flags for {} parameters", decay.size(), params_.size()));
  }
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
  if (masked_) {
    for (size_t i = 0; i < params_.size(); ++i) {
      state_[i][2] = Tensor::full_data(params_[i].shape(), decay[i] ? 1.0 : 0.0, params_[i].dtype());
    }
  }
}

std::vector<std::string> Adam::state_names() const {
  if (masked_) return {"exp_avg", "exp_avg_sq", "decay_mask"};
  return {"exp_avg", "exp_avg_sq"};
}

void Adam::begin_step() {
  const double t = static_cast<double>(steps());
  const double bc1 = 1 - std::pow(options_.beta1, t), bc2 = 1 - std::pow(options_.beta2, t);
  step_size_ = Tensor::full_data({}, lr() / bc1);
  sqrt_bias_correction2_ = Tensor::full_data({}, std::sqrt(bc2));
  decay_ = Tensor::full_data({}, 1 - lr() * options_.weight_decay);
  lr_decay_ = Tensor::full_data({}, lr() * options_.weight_decay);
}

void Adam::update(Tensor& param, const Tensor& grad, std::vector<Tensor>& state) {
  Tensor g = grad;
  if (options_.weight_decay != 0 && !decoupled_) g = g + (masked_ ? param * state[2] : param) * weight_decay_;
  Tensor& m = state[0];
  Tensor& v = state[1];
  m.assign(m * beta1_ + g * one_minus_beta1_);
  v.assign(v * beta2_ + square(g) * one_minus_beta2_);
  const Tensor denom = sqrt(v) / sqrt_bias_correction2_ + eps_;
  Tensor p = param;
  if (options_.weight_decay != 0 && decoupled_) p = masked_ ? param - param * state[2] * lr_decay_ : param * decay_;
  param.assign(p - m / denom * step_size_);
}

}  // namespace xs
