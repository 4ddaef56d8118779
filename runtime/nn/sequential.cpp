#include "xla_spawn/runtime/nn/sequential.h"

#include <string>

namespace xs {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> layers) : layers_(std::move(layers)) {
  for (size_t i = 0; i < layers_.size(); ++i) register_module(std::to_string(i), layers_[i]);
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& layer : layers_) h = layer->forward(h);
  return h;
}

}  // namespace xs
