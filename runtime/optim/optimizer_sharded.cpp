// Optimizer's sharded update (ZeRO stage 1, as PyTorch's ZeroRedundancyOptimizer): the flat
// gradient is reduce-scattered, each replica runs the optimizer's elementwise update on its
// 1/N chunk of the flat parameters with its 1/N chunk of the state, and the updated chunks
// are all-gathered. The collectives move the same bytes as one all-reduce; the update's work
// and the state's memory drop by N. Every replica traces the same graph: the ops carry the
// world size, and the runtime picks the ordinal's chunk when it runs them.
#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/collective_ops.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/optim/clip_grad.h"
#include "xla_spawn/runtime/optim/optimizer.h"

namespace xs {

// The gradients may be bf16 for f32 parameters (autocast's, exchanged in bf16): the chunk is
// cast to the parameters' dtype after the reduce-scatter.
bool Optimizer::can_shard(const std::vector<Tensor>& grads) const {
  if (!elementwise_update() || grads.size() != params_.size() || params_.empty()) return false;
  const DType g = grads[0].defined() ? grads[0].dtype() : params_[0].dtype();
  if (g != params_[0].dtype() && !(g == DType::kBF16 && params_[0].dtype() == DType::kF32))
    return false;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined() || grads[i].dtype() != g ||
        params_[i].dtype() != params_[0].dtype() || grads[i].shape() != params_[i].shape()) {
      return false;
    }
  }
  return true;
}

int64_t Optimizer::padded_elems(int64_t world_size) const {
  int64_t total = 0;
  for (const Tensor& p : params_) total += p.numel();
  return (total + world_size - 1) / world_size * world_size;
}

std::vector<Tensor> Optimizer::flat_parts(const std::vector<Tensor>& tensors, int64_t world_size,
                                          bool reshaped) const {
  std::vector<Tensor> parts;
  int64_t total = 0;
  for (const Tensor& t : tensors) {
    parts.push_back(reshaped ? reshape(t, {t.numel()}) : t);
    total += t.numel();
  }
  const int64_t pad = padded_elems(world_size) - total;
  if (pad != 0) parts.push_back(Tensor::zeros({pad}, tensors.front().dtype()));
  return parts;
}

Tensor Optimizer::flat_padded(const std::vector<Tensor>& tensors, int64_t world_size) const {
  const std::vector<Tensor> parts = flat_parts(tensors, world_size, true);
  return parts.size() == 1 ? parts.front() : concat(parts, 0);
}

std::vector<Tensor> Optimizer::unflat(const Tensor& flat) const {
  std::vector<Tensor> out;
  int64_t at = 0;
  for (const Tensor& p : params_) {
    out.push_back(reshape(slice(flat, 0, at, at + p.numel()), p.shape()));
    at += p.numel();
  }
  return out;
}

void Optimizer::shard_state(int64_t world_size) {
  shard_state_.clear();
  const size_t n_buffers = state_names().size();
  for (size_t k = 0; k < n_buffers; ++k) {
    std::vector<Tensor> whole;
    for (const std::vector<Tensor>& s : state_) whole.push_back(s[k]);
    shard_state_.push_back(local_shard(flat_parts(whole, world_size, false), world_size));
  }
  state_.assign(params_.size(), {});  // the whole buffers go with the next step
  shard_world_size_ = world_size;
}

Tensor Optimizer::apply_sharded(const std::vector<Tensor>& grads, ReduceOp op, int64_t world_size,
                                double max_norm) {
  if (!elementwise_update()) {
    throw InvalidArgument(
        "Optimizer::apply_sharded: this optimizer's update is not declared elementwise "
        "(elementwise_update()), so it cannot run on chunks that cut across parameters");
  }
  if (!can_shard(grads)) {
    throw InvalidArgument(fmt::format(
        "Optimizer::apply_sharded: {} gradients for {} parameters; all must be defined, of the "
        "parameters' shapes and of one dtype",
        grads.size(), params_.size()));
  }
  if (world_size < 1 || (shard_world_size_ != 0 && shard_world_size_ != world_size)) {
    throw InvalidArgument(fmt::format("Optimizer::apply_sharded: world size {} (state sharded {})",
                                      world_size, shard_world_size_));
  }
  NoGradGuard no_grad;
  if (shard_world_size_ == 0) shard_state(world_size);
  ++steps_;
  begin_step();
  Tensor grad = reduce_scatter(flat_padded(grads, world_size), op, world_size);
  if (grad.dtype() != params_[0].dtype()) grad = cast(grad, params_[0].dtype());
  Tensor norm;
  if (max_norm > 0) {  // the padding is zeros: it adds nothing to the sum of squares
    std::vector<Tensor> chunk{grad};
    norm = clip_to_norm(chunk, all_reduce(sum_of_squares(chunk), ReduceOp::kSum), max_norm);
    grad = chunk[0];
  }
  Tensor param = local_shard(flat_parts(params_, world_size, false), world_size);
  update(param, grad, shard_state_);
  const std::vector<Tensor> updated = unflat(all_gather(param, world_size));
  for (size_t i = 0; i < params_.size(); ++i) params_[i].assign(updated[i]);
  return norm;
}

NamedTensors Optimizer::gathered_state() const {
  const std::vector<std::string> names = state_names();
  std::vector<std::vector<Tensor>> whole;  // [buffer][param]
  for (const Tensor& chunk : shard_state_)
    whole.push_back(unflat(all_gather(chunk, shard_world_size_)));
  NamedTensors out;
  out.emplace_back("step", Tensor::from_vector<int64_t>({steps_}, {}));
  for (size_t i = 0; i < params_.size(); ++i) {
    for (size_t k = 0; k < names.size(); ++k)
      out.emplace_back(fmt::format("{}.{}", i, names[k]), whole[k][i]);
  }
  return out;
}

// `state` is checked by load_state: entry 1 + i * buffers + k is parameter i's buffer k.
void Optimizer::load_sharded_state(const NamedTensors& state) {
  const size_t n_buffers = state_names().size();
  for (size_t k = 0; k < n_buffers; ++k) {
    std::vector<Tensor> whole;
    for (size_t i = 0; i < params_.size(); ++i)
      whole.push_back(state[1 + i * n_buffers + k].second);
    shard_state_[k].assign(
        local_shard(flat_parts(whole, shard_world_size_, false), shard_world_size_));
  }
}

}  // namespace xs
