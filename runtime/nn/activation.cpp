#include "xla_spawn/runtime/nn/activation.h"

#include "xla_spawn/runtime/ops.h"

namespace xs {

Tensor ReLU::forward(const Tensor& x) {
  return relu(x);
}
Tensor GELU::forward(const Tensor& x) {
  return gelu(x);
}
Tensor Tanh::forward(const Tensor& x) {
  return tanh(x);
}

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : kernel_(kernel), stride_(stride == 0 ? kernel : stride), padding_(padding) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, {kernel_, kernel_}, {stride_, stride_}, {padding_, padding_});
}

Tensor Flatten::forward(const Tensor& x) {
  return reshape(x, {x.shape().at(0), -1});
}

}  // namespace xs
