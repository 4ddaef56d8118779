#include "xla_spawn/replica/optimizer_step.h"

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/env.h"
#include "xla_spawn/replica/divergence_check.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/replica/xm_collectives.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/optim/clip_grad.h"
#include "xla_spawn/runtime/runtime.h"
#include "xla_spawn/runtime/state_dict.h"

namespace xs::xm {

void broadcast_parameters(const NamedTensors& named) {
  if (world_size() == 1) return;
  StateDict state = to_state_dict(named);
  for (HostTensorData& t : state) {
    communicator().broadcast(t.bytes.data(), static_cast<size_t>(numel(t.shape)), t.dtype, 0);
  }
  load_state_dict(named, state);
}

bool sharded_update_enabled() {
  return env_bool(kShardedUpdateEnv).value_or(true);
}

bool bf16_exchange_enabled() {
  static const bool enabled = [] {
    const std::optional<std::string> v = env_string(kGradExchangeEnv);
    if (!v || *v == "auto") return true;
    if (*v == "f32") return false;
    throw InvalidArgument(fmt::format("{}={}: expected auto or f32", kGradExchangeEnv, *v));
  }();
  return enabled;
}

namespace {

// The bf16 value `g` is the f32 cast of, or an undefined tensor.
Tensor bf16_source(const Tensor& g) {
  if (!g.defined() || g.dtype() != DType::kF32 || !g.is_pending()) return {};
  const NodePtr node = g.ir();
  if (node->op != Op::kCast || node->operands[0]->type.dtype != DType::kBF16) return {};
  return Tensor::from_ir(node->operands[0]);
}

// `reduced[i]` cast back to f32 where `grads[i]` was f32 and went out as bf16.
std::vector<Tensor> as_given(std::vector<Tensor> reduced, const std::vector<Tensor>& grads) {
  for (size_t i = 0; i < reduced.size(); ++i) {
    if (reduced[i].defined() && reduced[i].dtype() != grads[i].dtype())
      reduced[i] = cast(reduced[i], grads[i].dtype());
  }
  return reduced;
}

}  // namespace

std::vector<Tensor> exchanged_gradients(const std::vector<Tensor>& grads) {
  std::vector<Tensor> out = grads;
  bool any = false;
  for (Tensor& g : out) {
    if (Tensor source = bf16_source(g); source.defined()) {
      g = std::move(source);
      any = true;
    }
  }
  if (!any) return grads;
  // The rest (a layer autocast left in f32, a weight used twice) go in bf16 too, rounded once:
  // one flat buffer per step, as the sharded update needs, and every byte halved.
  for (Tensor& g : out) {
    if (g.defined() && g.dtype() == DType::kF32) g = cast(g, DType::kBF16);
  }
  return out;
}

Tensor optimizer_step(Optimizer& optimizer, const NamedTensors& named_parameters, const StepOptions& options) {
  XS_CHECK_ARG(named_parameters.size() == optimizer.params().size(),
               "optimizer_step: {} names for {} parameters", named_parameters.size(),
               optimizer.params().size());
  Tensor norm;
  {
    // Scoped: a gradient still referenced at mark_step() would be a step output (a copy, and
    // a buffer the backward pass could not share with the flat collective operand).
    const std::vector<Tensor> grads = optimizer.gradients();
    const bool bf16 = options.bf16_exchange && bf16_exchange_enabled() && world_size() > 1;
    const std::vector<Tensor> exchanged = bf16 ? exchanged_gradients(grads) : grads;
    // Once sharded the state stays so (apply() would throw): apply_sharded names the problem.
    if (optimizer.shard_world_size() != 0 ||
        (world_size() > 1 && sharded_update_enabled() && optimizer.can_shard(exchanged))) {
      norm = optimizer.apply_sharded(exchanged, ReduceOp::kMean, world_size(),
                                     options.clip_grad_norm);
    } else {
      std::vector<Tensor> reduced = as_given(all_reduce(exchanged, ReduceOp::kMean), grads);
      if (options.clip_grad_norm > 0) norm = clip_gradients(reduced, options.clip_grad_norm);
      optimizer.apply(reduced);
    }
  }
  optimizer.zero_grad();
  mark_step();
  if (debug_replicas()) check_replicas_identical(named_parameters, optimizer.steps());
  return norm;
}

void optimizer_step(Optimizer& optimizer, const NamedTensors& named_parameters) {
  optimizer_step(optimizer, named_parameters, StepOptions{});
}

void optimizer_step(Optimizer& optimizer) {
  NamedTensors params;
  for (size_t i = 0; i < optimizer.params().size(); ++i) {
    params.emplace_back(fmt::format("param {}", i), optimizer.params()[i]);
  }
  optimizer_step(optimizer, params);
}

}  // namespace xs::xm
