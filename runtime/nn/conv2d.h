#pragma once
// 2-D convolution layer over NCHW input with an OIHW weight (square kernel), PyTorch's default
// initialisation (fan_in = in_channels * k * k).
//
//   Conv2d conv(1, 32, /*kernel=*/5, gen, /*stride=*/1, /*padding=*/2);
//   Tensor y = conv(x);          // [N, 1, 28, 28] -> [N, 32, 28, 28]

#include <cstdint>

#include "xla_spawn/runtime/nn/generator.h"
#include "xla_spawn/runtime/nn/module.h"

namespace xs {

class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, Generator& gen,
         int64_t stride = 1, int64_t padding = 0, bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor& weight() { return *weight_; }
  Tensor* bias() { return bias_; }

 private:
  Tensor* weight_;
  Tensor* bias_ = nullptr;
  int64_t stride_, padding_;
};

}  // namespace xs
