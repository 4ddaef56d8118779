#include "xla_spawn/runtime/optim/optimizer.h"

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/state_dict.h"

namespace xs {

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].defined() || !params_[i].requires_grad() || !params_[i].is_leaf()) {
      throw InvalidArgument(
          fmt::format("Optimizer: parameter {} is not a leaf that requires gradients", i));
    }
  }
  set_lr(lr);
}

void Optimizer::init_state() {
  const std::vector<std::string> names = state_names();
  state_.assign(params_.size(), {});
  for (size_t i = 0; i < params_.size(); ++i) {
    for (size_t k = 0; k < names.size(); ++k) {
      state_[i].push_back(Tensor::full_data(params_[i].shape(), 0, params_[i].dtype()));
    }
  }
}

void Optimizer::set_lr(double lr) {
  if (!(lr >= 0)) throw InvalidArgument(fmt::format("Optimizer: learning rate {} is not >= 0", lr));
  lr_value_ = lr;
  lr_ = Tensor::full_data({}, lr);  // data, even for 0 or 1: the graph never sees the value
}

std::vector<Tensor> Optimizer::gradients() const {
  std::vector<Tensor> out;
  out.reserve(params_.size());
  for (const Tensor& p : params_) out.push_back(p.grad());
  return out;
}

void Optimizer::apply(const std::vector<Tensor>& grads) {
  if (grads.size() != params_.size()) {
    throw InvalidArgument(fmt::format("Optimizer::apply: {} gradients for {} parameters",
                                      grads.size(), params_.size()));
  }
  if (shard_world_size_ != 0) {
    throw InvalidArgument("Optimizer::apply: the state is sharded; call apply_sharded");
  }
  NoGradGuard no_grad;
  ++steps_;
  begin_step();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i].defined()) continue;
    if (grads[i].shape() != params_[i].shape()) {
      throw InvalidArgument(fmt::format("Optimizer::apply: gradient {} for parameter {} of {}",
                                        type_str(grads[i].type()), i, type_str(params_[i].type())));
    }
    update(params_[i], grads[i], state_[i]);
  }
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.set_grad({});
}

NamedTensors Optimizer::named_state() const {
  if (shard_world_size_ != 0) return gathered_state();
  NamedTensors out;
  out.emplace_back("step", Tensor::from_vector<int64_t>({steps_}, {}));
  const std::vector<std::string> names = state_names();
  for (size_t i = 0; i < state_.size(); ++i) {
    for (size_t k = 0; k < names.size(); ++k)
      out.emplace_back(fmt::format("{}.{}", i, names[k]), state_[i][k]);
  }
  return out;
}

void Optimizer::load_state(const NamedTensors& state) {
  const NamedTensors mine = named_state();
  if (state.size() != mine.size()) {
    throw InvalidArgument(
        fmt::format("Optimizer::load_state: {} entries, expected {}", state.size(), mine.size()));
  }
  for (size_t j = 0; j < mine.size(); ++j) {
    const auto& [name, t] = state[j];
    if (name != mine[j].first || t.shape() != mine[j].second.shape() ||
        !loads_as(t.dtype(), mine[j].second.dtype())) {
      throw InvalidArgument(
          fmt::format("Optimizer::load_state: entry {} is '{}' {}, expected '{}' {}", j, name,
                      type_str(t.type()), mine[j].first, type_str(mine[j].second.type())));
    }
  }
  steps_ = state[0].second.to_vector<int64_t>()[0];
  // f32 entries into bf16 state (XLA_SPAWN_USE_BF16) or back: converted (see loads_as).
  NamedTensors as_held = state;
  for (size_t j = 1; j < state.size(); ++j) {
    if (state[j].second.dtype() != mine[j].second.dtype()) {
      NoGradGuard no_grad;
      as_held[j].second = cast(state[j].second, mine[j].second.dtype());
    }
  }
  if (shard_world_size_ != 0) return load_sharded_state(as_held);
  for (size_t j = 1; j < as_held.size(); ++j) {
    const size_t i = (j - 1) / state_names().size(), k = (j - 1) % state_names().size();
    state_[i][k].assign(as_held[j].second);
  }
}

}  // namespace xs
