#pragma once
// Stochastic gradient descent with optional momentum (PyTorch's form, dampening 0: the buffer
// starts at zero, so the first step's buffer is the gradient, as in PyTorch), Nesterov
// momentum and L2 weight decay added to the gradient.
//
//   SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9, .nesterov = true});

#include "xla_spawn/runtime/optim/optimizer.h"

namespace xs {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SgdOptions options);

 protected:
  void update(Tensor& param, const Tensor& grad, std::vector<Tensor>& state) override;
  bool elementwise_update() const override { return true; }
  std::vector<std::string> state_names() const override;

 private:
  SgdOptions options_;
  Tensor momentum_, weight_decay_;  // data scalars shared by every parameter's update
};

}  // namespace xs
