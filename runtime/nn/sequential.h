#pragma once
// Runs child modules in order; they are named "0", "1", ... (as torch.nn.Sequential).
//
//   Sequential mlp({std::make_shared<Linear>(784, 512, gen), std::make_shared<ReLU>(),
//                   std::make_shared<Linear>(512, 10, gen)});

#include <memory>
#include <vector>

#include "xla_spawn/runtime/nn/module.h"

namespace xs {

class Sequential : public Module {
 public:
  explicit Sequential(std::vector<std::shared_ptr<Module>> layers);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return layers_.size(); }
  Module& at(size_t i) { return *layers_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

}  // namespace xs
