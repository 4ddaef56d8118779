#pragma once
// Dropout with in-graph randomness: in training each element is kept with probability 1 - p
// and scaled by 1 / (1 - p); the mask comes from a bernoulli op whose seed is a data input
// drawn from the runtime's seed stream, so every step draws a new mask without recompiling.
// Identity in eval mode.
//
//   Dropout drop(0.5);  Tensor y = drop(x);

#include "xla_spawn/runtime/nn/module.h"

namespace xs {

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;

 private:
  double p_;
};

}  // namespace xs
