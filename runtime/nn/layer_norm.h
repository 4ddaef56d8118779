#pragma once
// LayerNorm over the last axis with a learned scale (ones) and shift (zeros), as PyTorch's
// nn.LayerNorm(dim): one fused op forward and one per gradient (runtime/kernels/norm.cpp).
//
//   LayerNorm ln(128);
//   Tensor y = ln(x);                  // x [..., 128]

#include <cstdint>

#include "xla_spawn/runtime/nn/module.h"

namespace xs {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;

 private:
  Tensor* weight_;
  Tensor* bias_;
  double eps_;
};

}  // namespace xs
