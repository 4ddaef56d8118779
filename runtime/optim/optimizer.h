#pragma once
// Optimizer base: parameters, a learning rate held as a data scalar (changing it never
// recompiles), state tensors created materialised (Tensor::full_data) so step 1 traces the same
// graph as every later step, and a split step for the replica layer: take the gradients,
// transform them (all-reduce), then apply; or, across replicas, the sharded update
// (apply_sharded, ZeRO stage 1: each replica updates 1/N of the parameters and keeps 1/N of the
// state; optimizer_sharded.cpp).
//
//   SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
//   backward(loss);
//   opt.step();            // == opt.apply(opt.gradients())
//   opt.zero_grad();       // before mark_step: gradients need not be step outputs
//   mark_step();

#include <cstdint>
#include <string>
#include <vector>

#include "xla_spawn/base/dtype.h"
#include "xla_spawn/runtime/nn/module.h"
#include "xla_spawn/runtime/tensor.h"

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
  // The sharded update over `world_size` replicas, recorded into the step's graph: the
  // gradients, flattened (zero-padded to a multiple of world_size), are reduce-scattered with
  // `op`; this replica updates its chunk of the flat parameters with its chunk of the state;
  // the chunks are all-gathered back into every parameter. The same arithmetic per element as
  // apply(all_reduce(grads, op)). The first call turns the state into this replica's chunks;
  // from then on named_state() and load_state() gather or split the full state in-graph
  // (collective: every replica must call them alike) and apply() throws.
  // With max_norm > 0 the reduced gradient is first clipped by its global L2 norm, as
  // clip_gradients does on whole gradients: the chunks' sums of squares are all-reduced
  // in-graph (a 0-d sum), and the norm before clipping is returned (undefined without).
  Tensor apply_sharded(const std::vector<Tensor>& grads, ReduceOp op, int64_t world_size,
                       double max_norm = 0);
  // Whether apply_sharded can take `grads`: the update is elementwise_update(), the gradients
  // all defined, of the parameters' shapes and of one dtype (also the parameters').
  bool can_shard(const std::vector<Tensor>& grads) const;
  // The world size of the sharded state; 0 while the state is whole.
  int64_t shard_world_size() const { return shard_world_size_; }
  // Drops the gradients (PyTorch's set_to_none): the next backward starts them afresh.
  void zero_grad();

  double lr() const { return lr_value_; }
  void set_lr(double lr);
  // The learning rate as a 0-d data tensor, for use inside update graphs.
  const Tensor& lr_tensor() const { return lr_; }
  int64_t steps() const { return steps_; }
  const std::vector<Tensor>& params() const { return params_; }

  // Optimizer state for checkpoints: "step" (i64 0-d) and "<param index>.<buffer>", always
  // the whole state (sharded: all-gathered in-graph, so every replica must call it).
  NamedTensors named_state() const;
  // Restores what named_state() returned (matched by name; shapes and dtypes checked).
  void load_state(const NamedTensors& state);

 protected:
  // One parameter's update; `state` holds this optimizer's buffers for it. It must be
  // elementwise (each result element depends only on the same element of param, grad and
  // state, plus scalars): apply_sharded runs it on flat chunks that cut across parameters, so
  // an update with per-tensor reductions (LAMB's trust ratio) would need its own sharding.
  virtual void update(Tensor& param, const Tensor& grad, std::vector<Tensor>& state) = 0;
  // An optimizer whose update() is elementwise says so here; only then may apply_sharded run
  // it on chunks. The default keeps the update whole, which is right for any update.
  virtual bool elementwise_update() const { return false; }
  // Called once per apply() before the updates (host-side per-step scalars such as Adam's bias
  // corrections, set as data so they do not recompile).
  virtual void begin_step() {}
  // Buffer names per parameter, created zero-filled on the parameter's shape.
  virtual std::vector<std::string> state_names() const = 0;
  void init_state();

  std::vector<Tensor> params_;
  std::vector<std::vector<Tensor>> state_;  // [param][buffer]; empty once sharded

 private:
  // Sharded state: elements of the flat parameters, padded to a multiple of the world size.
  int64_t padded_elems(int64_t world_size) const;
  // The tensors flattened into one 1-D tensor with zeros up to padded_elems(); or its parts
  // (`reshaped` to 1-D, or as they are for local_shard, which reads them flat anyway).
  Tensor flat_padded(const std::vector<Tensor>& tensors, int64_t world_size) const;
  std::vector<Tensor> flat_parts(const std::vector<Tensor>& tensors, int64_t world_size,
                                 bool reshaped) const;
  // Per parameter, its slice of a flat (padded) tensor, shaped like the parameter.
  std::vector<Tensor> unflat(const Tensor& flat) const;
  void shard_state(int64_t world_size);
  NamedTensors gathered_state() const;
  void load_sharded_state(const NamedTensors& state);

  std::vector<Tensor> shard_state_;  // [buffer]: this replica's chunk of the flat buffer
  int64_t shard_world_size_ = 0;
  Tensor lr_;
  double lr_value_;
  int64_t steps_ = 0;
};

}  // namespace xs
