#pragma once
// Parameter-free elementwise activation modules (for Sequential) and max pooling and
// flattening, which are layers without state too.
//
//   Sequential net({conv, std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2),
//                   std::make_shared<Flatten>(), fc});

#include <cstdint>

#include "xla_spawn/runtime/nn/module.h"

namespace xs {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

class GELU : public Module {  // exact (erf) form
 public:
  Tensor forward(const Tensor& x) override;
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

// Square window; stride defaults to the kernel size (PyTorch's default).
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;

 private:
  int64_t kernel_, stride_, padding_;
};

// [N, ...] -> [N, prod(...)].
class Flatten : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

}  // namespace xs
