#pragma once
// Optimizer base: parameters, a learning rate held as a data scalar (changing it never
// recompiles), state tensors created materialised (Tensor::full_data) so step 1 traces the same
// graph as every later step, and a split step for the replica layer: take the gradients,
// transform them (all-reduce), then apply.
//
//   SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
//   backward(loss);
//   opt.step();            // == opt.apply(opt.gradients())
//   opt.zero_grad();       // before mark_step: gradients need not be step outputs
//   mark_step();

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/nn/module.h"
#include "runtime/tensor.h"

namespace xs {

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;

  // The parameters' gradients in parameter order (undefined where backward gave none).
  std::vector<Tensor> gradients() const;
  // Records the update of every parameter from `grads` (same order and shapes as gradients();
  // undefined entries are skipped) under no_grad, and counts a step.
  void apply(const std::vector<Tensor>& grads);
  void step() { apply(gradients()); }
  // Drops the gradients (PyTorch's set_to_none): the next backward starts them afresh.
  void zero_grad();

  double lr() const { return lr_value_; }
  void set_lr(double lr);
  // The learning rate as a 0-d data tensor, for use inside update graphs.
  const Tensor& lr_tensor() const { return lr_; }
  int64_t steps() const { return steps_; }
  const std::vector<Tensor>& params() const { return params_; }

  // Optimizer state for checkpoints: "step" (i64 0-d) and "<param index>.<buffer>".
  NamedTensors named_state() const;
  // Restores what named_state() returned (matched by name; shapes and dtypes checked).
  void load_state(const NamedTensors& state);

 protected:
  // One parameter's update; `state` holds this optimizer's buffers for it.
  virtual void update(Tensor& param, const Tensor& grad, std::vector<Tensor>& state) = 0;
  // Called once per apply() before the updates (host-side per-step scalars such as Adam's bias
  // corrections, set as data so they do not recompile).
  virtual void begin_step() {}
  // Buffer names per parameter, created zero-filled on the parameter's shape.
  virtual std::vector<std::string> state_names() const = 0;
  void init_state();

  std::vector<Tensor> params_;
  std::vector<std::vector<Tensor>> state_;

 private:
  Tensor lr_;
  double lr_value_;
  int64_t steps_ = 0;
};

}  // namespace xs
