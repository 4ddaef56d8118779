#pragma once
// Packing a list of tensors into one flat 1-D tensor and back, in-graph: how the replica layer
// all-reduces every gradient with a few collectives instead of one per tensor.
//
//   std::vector<Tensor> grads = opt.gradients();
//   Tensor flat = flatten_tensors(grads);                       // f32[total]
//   opt.apply(unflatten_tensors(all_reduce(flat, ReduceOp::kMean), grads));

#include <vector>

#include "xla_spawn/runtime/tensor.h"

namespace xs {

// Concatenates the tensors (all defined, one dtype), each reshaped to 1-D, in order.
Tensor flatten_tensors(const std::vector<Tensor>& tensors);

// Splits `flat` into tensors shaped like `like` (same order; undefined entries of `like` are
// skipped in `flat` and come back undefined).
std::vector<Tensor> unflatten_tensors(const Tensor& flat, const std::vector<Tensor>& like);

}  // namespace xs
