#include "replica/optimizer_step.h"

#include <fmt/format.h>

#include "base/check.h"
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

void optimizer_step(Optimizer& optimizer, const NamedTensors& named_parameters) {
  XS_CHECK_ARG(named_parameters.size() == optimizer.params().size(),
               "optimizer_step: {} names for {} parameters", named_parameters.size(),
               optimizer.params().size());
  optimizer.apply(all_reduce(optimizer.gradients(), ReduceOp::kMean));
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
