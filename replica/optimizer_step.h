#pragma once
// xm.optimizer_step for the lazy runtime: the gradients' mean all-reduce is recorded into the
// same graph as the forward, backward and update (one in-graph collective per dtype over the
// gradients flattened into one buffer), so a step is one compiled program. And the start of
// training: every replica takes the master's initial parameters.
// With N > 1 replicas the update is sharded (ZeRO stage 1, Optimizer::apply_sharded): the
// gradients are reduce-scattered, each replica updates 1/N of the parameters and holds 1/N of
// the optimizer state, and the parameters are all-gathered, still in one graph. On one node the
// results are the same bits as the all-reduce path (across nodes every replica agrees, but the
// network's sums may round in another order); XLA_SPAWN_SHARDED_UPDATE=0 turns it off.
//
//   xs::xm::broadcast_parameters(model.named_state());
//   backward(loss); xs::xm::optimizer_step(opt);      // all-reduce, update, mark_step

#include <vector>

#include "xla_spawn/runtime/nn/module.h"
#include "xla_spawn/runtime/optim/optimizer.h"

namespace xs::xm {

// Collective: replaces every tensor's value by ordinal 0's (as materialised data).
void broadcast_parameters(const NamedTensors& named);

inline constexpr const char* kShardedUpdateEnv = "XLA_SPAWN_SHARDED_UPDATE";
// Whether optimizer_step shards the update (XLA_SPAWN_SHARDED_UPDATE, default on).
bool sharded_update_enabled();

// Mean-all-reduces the optimizer's gradients in-graph, records the update, drops the
// gradients and runs the step (mark_step). Sharded (see above) when enabled, the world size is
// above 1 and Optimizer::can_shard takes the gradients, or the state is sharded already. With XLA_SPAWN_DEBUG_REPLICAS=1 it then checks
// that every replica ran the same graph and holds the same parameters (PeerFailure if not).
void optimizer_step(Optimizer& optimizer);
// The same; the debug check names parameters by `named_parameters` (the module's names, in the
// optimizer's parameter order, e.g. model.named_parameters()) instead of "param <index>".
void optimizer_step(Optimizer& optimizer, const NamedTensors& named_parameters);

struct StepOptions {
  // > 0: clip the mean gradient by its global L2 norm in-graph, never read on the host (the
  // PyTorch/XLA guide's clip_grad_norm_ without item()); sharded, the chunks' squares are summed
  // by a 0-d all-reduce in the same graph.
  double clip_grad_norm = 0;
  // When autocast made gradients in bf16 (a master weight's f32 gradient is the cast of its
  // bf16 copy's), the gradients cross replicas in bf16: those before that cast (exact), any
  // other f32 one rounded once; half the bytes, summed in f32 and rounded once by the
  // collective. false (or XLA_SPAWN_GRAD_EXCHANGE=f32) exchanges them in f32.
  bool bf16_exchange = true;
};

inline constexpr const char* kGradExchangeEnv = "XLA_SPAWN_GRAD_EXCHANGE";
// XLA_SPAWN_GRAD_EXCHANGE: "auto" (default: bf16 where autocast made the gradient bf16) or
// "f32"; anything else is an InvalidArgument.
bool bf16_exchange_enabled();

// What optimizer_step exchanges for `grads` when bf16_exchange is on: if any gradient is the f32
// cast of a bf16 value (autocast's), that value for each such gradient and every other f32
// gradient cast to bf16; else `grads` themselves.
std::vector<Tensor> exchanged_gradients(const std::vector<Tensor>& grads);
// The same with options; returns the gradient norm before clipping (materialised by the step;
// undefined without clipping).
Tensor optimizer_step(Optimizer& optimizer, const NamedTensors& named_parameters, const StepOptions& options);

}  // namespace xs::xm
