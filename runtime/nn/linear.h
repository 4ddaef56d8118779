#pragma once
// Linear (fully connected) layer, y = x W^T + b, with W [out, in] as PyTorch stores it and
// PyTorch's default initialisation, or (init_std > 0) GPT-2's: W ~ N(0, init_std^2), b = 0.
//
//   Generator gen(0);
//   Linear fc(784, 512, gen);
//   Tensor y = fc(x);            // x [N, 784] -> y [N, 512]

#include <cstdint>

#include "xla_spawn/runtime/nn/generator.h"
#include "xla_spawn/runtime/nn/module.h"

namespace xs {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Generator& gen, bool bias = true,
         double init_std = 0);
  Tensor forward(const Tensor& x) override;
  Tensor& weight() { return *weight_; }
  Tensor* bias() { return bias_; }

 private:
  Tensor* weight_;
  Tensor* bias_ = nullptr;
};

}  // namespace xs
