#include "xla_spawn/runtime/optim/adam.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include <spdlog/spdlog.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autocast.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

namespace {

// Under XLA_SPAWN_USE_BF16 the optimizer's constants and state are bf16 too, as with
// PyTorch/XLA's XLA_USE_BF16: say so when that changes what Adam does (beta2 = 0.999 is 1 in
// bf16, so the second moment never decays; a decoupled decay factor 1 - lr * wd under 2^-9 from
// 1 rounds to 1).
void warn_if_lost_in_bf16(const AdamOptions& o, bool decoupled) {
  if (!use_bf16()) return;
  const auto in_bf16 = [](double v) { return static_cast<double>(BF16::from_float(static_cast<float>(v)).to_float()); };
  if (in_bf16(o.beta2) == 1.0 || in_bf16(o.beta1) == 1.0) {
    spdlog::warn("Adam: betas ({}, {}) round to ({}, {}) in bf16 under {}=1, so a moment never "
                 "decays; autocast (f32 master weights and state) keeps them",
                 o.beta1, o.beta2, in_bf16(o.beta1), in_bf16(o.beta2), kUseBF16Env);
  }
  if (decoupled && o.weight_decay > 0 && in_bf16(1 - o.lr * o.weight_decay) == 1.0) {
    spdlog::warn("Adam: a weight-decay factor 1 - lr * weight_decay = {} is 1 in bf16 under {}=1: "
                 "decoupled decay does nothing",
                 1 - o.lr * o.weight_decay, kUseBF16Env);
  }
}

}  // namespace

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
  warn_if_lost_in_bf16(options, decoupled_weight_decay);
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
