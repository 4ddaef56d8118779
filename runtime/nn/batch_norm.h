#pragma once
// BatchNorm2d over NCHW: in training normalises with the batch's per-channel mean and biased
// variance and updates the running statistics in-graph (buffers running_mean, running_var,
// momentum 0.1, unbiased variance, as PyTorch); in eval normalises with the running
// statistics. weight starts at 1, bias at 0.
//
//   BatchNorm2d bn(32);  Tensor y = bn(x);   // x [N, 32, H, W]

#include <cstdint>

#include "xla_spawn/runtime/nn/module.h"

namespace xs {

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;
  Tensor& running_mean() { return *running_mean_; }
  Tensor& running_var() { return *running_var_; }

 private:
  Tensor* weight_;
  Tensor* bias_;
  Tensor* running_mean_;
  Tensor* running_var_;
  int64_t channels_;
  double eps_, momentum_;
};

}  // namespace xs
