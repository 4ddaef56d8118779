#pragma once
// Adam (Kingma & Ba) with bias correction, and AdamW (decoupled weight decay, Loshchilov &
// Hutter), as PyTorch computes them. Per-step scalars (bias corrections) are data inputs, so
// every step runs the same compiled graph.
//
//   AdamW opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.01});
//   AdamW opt(params, {.weight_decay = 0.1}, decay_matrices_only(params));  // as GPT training does

#include "xla_spawn/runtime/optim/optimizer.h"

namespace xs {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // Adam: L2 added to the gradient; AdamW: decoupled decay
};

// One flag per parameter: true for matrices and higher ranks, false for vectors and scalars
// (biases, LayerNorm's scale and shift), the usual choice of which parameters AdamW decays.
std::vector<bool> decay_matrices_only(const std::vector<Tensor>& params);

class Adam : public Optimizer {
 public:
  // decay: per parameter, whether weight decay applies to it (empty: all). With some false the
  // per-element choice is a state buffer "decay_mask" (1 or 0), so the sharded update, whose
  // chunks cut across parameters, applies it element by element too.
  Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled_weight_decay = false,
       std::vector<bool> decay = {});

 protected:
  void begin_step() override;
  void update(Tensor& param, const Tensor& grad, std::vector<Tensor>& state) override;
  bool elementwise_update() const override { return true; }
  std::vector<std::string> state_names() const override;

 private:
  AdamOptions options_;
  bool decoupled_;
  bool masked_;  // some parameters are not decayed: state[2] is the decay mask
  Tensor beta1_, one_minus_beta1_, beta2_, one_minus_beta2_, eps_, weight_decay_;
  Tensor step_size_, sqrt_bias_correction2_, decay_, lr_decay_;  // refreshed each step
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions options, std::vector<bool> decay = {})
      : Adam(std::move(params), options, true, std::move(decay)) {}
};

}  // namespace xs
