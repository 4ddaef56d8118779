#include "xla_spawn/replica/optimizer_step.h"

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/env.h"
#include "xla_spawn/replica/divergence_check.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/replica/xm_collectives.h"
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

Tensor optimizer_step(Optimizer& optimizer, const NamedTensors& named_parameters, const StepOptions& options) {
  XS_CHECK_ARG(named_parameters.size() == optimizer.params().size(),
               "optimizer_step: {} names for {} parameters", named_parameters.size(),
               optimizer.params().size());
  Tensor norm;
  {
    // Scoped: a gradient still referenced at mark_step() would be a step output (a copy, and
    // a buffer the backward pass could not share with the flat collective operand).
    const std::vector<Tensor> grads = optimizer.gradients();
    // Once sharded the state stays so (apply() would throw): apply_sharded names the problem.
    if (optimizer.shard_world_size() != 0 ||
        (world_size() > 1 && sharded_update_enabled() && optimizer.can_shard(grads))) {
      norm = optimizer.apply_sharded(grads, ReduceOp::kMean, world_size(), options.clip_grad_norm);
    } else {
      std::vector<Tensor> reduced = all_reduce(grads, ReduceOp::kMean);
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
