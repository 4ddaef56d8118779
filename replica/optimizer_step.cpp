#include "replica/optimizer_step.h"

#include <fmt/format.h>

#include "base/check.h"
#include "base/env.h"
#include "replica/divergence_check.h"
#include "replica/xm.h"
#include "replica/xm_collectives.h"
#include "runtime/runtime.h"
#include "runtime/state_dict.h"

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

void optimizer_step(Optimizer& optimizer, const NamedTensors& named_parameters) {
  XS_CHECK_ARG(named_parameters.size() == optimizer.params().size(),
               "optimizer_step: {} names for {} parameters", named_parameters.size(),
               optimizer.params().size());
  {
    // Scoped: a gradient still referenced at mark_step() would be a step output (a copy, and
    // a buffer the backward pass could not share with the flat collective operand).
    const std::vector<Tensor> grads = optimizer.gradients();
    // Once sharded the state stays so (apply() would throw): apply_sharded names the problem.
    if (optimizer.shard_world_size() != 0 ||
        (world_size() > 1 && sharded_update_enabled() && optimizer.can_shard(grads))) {
      optimizer.apply_sharded(grads, ReduceOp::kMean, world_size());
    } else {
      optimizer.apply(all_reduce(grads, ReduceOp::kMean));
    }
  }
  optimizer.zero_grad();
  mark_step();
  if (debug_replicas()) check_replicas_identical(named_parameters, optimizer.steps());
}

void optimizer_step(Optimizer& optimizer) {
  NamedTensors params;
  for (size_t i = 0; i < optimizer.params().size(); ++i) {
    params.emplace_back(fmt::format("param {}", i), optimizer.params()[i]);
  }
  optimizer_step(optimizer, params);
}

}  // namespace xs::xm
