#pragma once
// User-called collectives of the replica API (xm.all_reduce, xm.all_gather, xm.rendezvous,
// xm.mesh_reduce): on host values through the job's communicator, and on lazy tensors as one
// in-graph all-reduce over a flat buffer. Every replica must make the same calls in order.
//
//   double loss = xs::xm::mesh_reduce("epoch_loss", local_loss, xs::ReduceOp::kMean);
//   std::vector<Tensor> g = xs::xm::all_reduce(grads, xs::ReduceOp::kMean);  // recorded, lazy

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "xla_spawn/base/dtype.h"
#include "xla_spawn/runtime/tensor.h"

namespace xs::xm {

// Host values, in place.
void all_reduce(std::span<float> data, ReduceOp op);
void all_reduce(std::span<double> data, ReduceOp op);
void all_reduce(std::span<int64_t> data, ReduceOp op);
// out[k * in.size() + i] = ordinal k's in[i].
std::vector<double> all_gather(std::span<const double> in);
// `in` holds world_size chunks of equal size; returns this ordinal's reduced chunk.
std::vector<double> reduce_scatter(std::span<const double> in, ReduceOp op);
// Waits for every replica to reach `tag` and returns each ordinal's payload.
std::vector<std::vector<std::byte>> rendezvous(const std::string& tag,
                                               std::span<const std::byte> payload = {});
// Reduces one host value over the replicas (every replica gets the result).
double mesh_reduce(const std::string& tag, double value, ReduceOp op);

// In-graph: records one all-reduce per dtype over the tensors flattened into one buffer
// (concat), and returns the reduced tensors sliced back to their shapes. Undefined entries
// stay undefined. At world size 1 the tensors are returned unchanged (no collective).
std::vector<Tensor> all_reduce(const std::vector<Tensor>& tensors, ReduceOp op);

}  // namespace xs::xm
