#pragma once
// Module: the base of layers. Holds named parameters (leaves requiring gradients), named
// buffers (state updated in-graph, such as BatchNorm's running statistics) and child modules,
// and a train/eval mode that children follow. Names nest with '.', as PyTorch's state_dict.
//
//   auto model = std::make_shared<Sequential>(...);
//   for (auto& [name, p] : model->named_parameters()) ...;   // "0.weight", "0.bias", ...
//   model->eval(); Tensor y = model->forward(x);

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "xla_spawn/runtime/tensor.h"

namespace xs {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Recursive, in registration order; the handles share state with the module's tensors (an
  // optimizer's assign() updates the module).
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  // Parameters then buffers: everything a checkpoint needs.
  NamedTensors named_state() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

 protected:
  // Marks `t` as requiring gradients and registers it; returns the stored handle.
  Tensor& register_parameter(std::string name, Tensor t);
  Tensor& register_buffer(std::string name, Tensor t);
  void register_module(std::string name, std::shared_ptr<Module> child);

 private:
  void collect(const std::string& prefix, bool parameters, NamedTensors& out) const;

  bool training_ = true;
  // Deques would do as well; unique_ptr keeps the returned references stable.
  std::vector<std::pair<std::string, std::unique_ptr<Tensor>>> parameters_;
  std::vector<std::pair<std::string, std::unique_ptr<Tensor>>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace xs
