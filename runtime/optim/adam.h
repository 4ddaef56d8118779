#pragma once
// Adam (Kingma & Ba) with bias correction, and AdamW (decoupled weight decay, Loshchilov &
// Hutter), as PyTorch computes them. Per-step scalars (bias corrections) are data inputs, so
// every step runs the same compiled graph.
//
//   AdamW opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.01});

#include "runtime/optim/optimizer.h"

namespace xs {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // Adam: L2 added to the gradient; AdamW: decoupled decay
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled_weight_decay = false);

 protected:
  void begin_step() override;
  void update(Tensor& param, const Tensor& grad, std::vector<Tensor>& state) override;
  bool elementwise_update() const override { return true; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  AdamOptions options_;
  bool decoupled_;
  Tensor beta1_, one_minus_beta1_, beta2_, one_minus_beta2_, eps_, weight_decay_;
  Tensor step_size_, sqrt_bias_correction2_, decay_;  // refreshed each step
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions options) : Adam(std::move(params), options, true) {}
};

}  // namespace xs
