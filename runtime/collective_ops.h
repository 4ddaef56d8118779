#pragma once
// In-graph reduce-scatter, all-gather and this replica's shard of a flat tensor: the ops of a
// sharded optimizer update (ZeRO stage 1), recorded into the step's one graph like all_reduce.
// world_size is part of the op (shapes depend on it); the ordinal is not, so every replica
// traces the same graph and the runtime picks the chunk when it runs.
//
//   Tensor g = reduce_scatter(flat_grads, ReduceOp::kMean, n);   // f32[k * n] -> f32[k]
//   Tensor p = local_shard({w, b}, n);          // chunk of concat({w, b}), f32[k * n] -> f32[k]
//   Tensor all = all_gather(p - lr * g, n);                       // f32[k] -> f32[k * n]

#include <cstdint>
#include <span>

#include "xla_spawn/base/dtype.h"
#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/runtime/kernels/kernels.h"
#include "xla_spawn/runtime/tensor.h"

namespace xs {

// 1-D x of k * world_size elements: chunk `ordinal` (k elements) reduced over the replicas.
Tensor reduce_scatter(const Tensor& x, ReduceOp op, int64_t world_size,
                      SourceLoc loc = SourceLoc::current());
// 1-D x of k elements: every replica's x, in ordinal order (k * world_size elements).
Tensor all_gather(const Tensor& x, int64_t world_size, SourceLoc loc = SourceLoc::current());
// Tensors (any shapes, read flat) of k * world_size elements in all: this replica's chunk of
// their flat concatenation (elements ordinal * k ..), copied straight from the parts (neither
// the concatenation nor a flat copy of a part is built).
Tensor local_shard(const std::vector<Tensor>& parts, int64_t world_size,
                   SourceLoc loc = SourceLoc::current());

}  // namespace xs

namespace xs::detail {

// Runs kReduceScatter, kAllGather and kShard through env.communicator (none: world size 1).
// Throws InvalidArgument when the op's world size is not the communicator's.
void run_collective_kernel(Op op, const Attrs& attrs, std::span<const Arg> ins, const Arg& out,
                           const ExecEnv& env);
// kAllGather of `in` whose gathered value goes to `pieces` (alias_views made it so: the value
// was only ever sliced into other storage) instead of one output buffer.
void run_all_gather_pieces(const Attrs& attrs, const Arg& in, std::span<const GatherPiece> pieces,
                           const ExecEnv& env);

}  // namespace xs::detail
