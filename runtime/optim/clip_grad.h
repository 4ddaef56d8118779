#pragma once
// Gradient clipping by global L2 norm, computed in-graph (no host read of the norm, as the
// PyTorch/XLA guide recommends): every gradient is scaled by min(1, max_norm / (norm + 1e-6)).
//
//   Tensor norm = clip_grad_norm(model.parameters(), 1.0);   // pending; read it only to log

#include <vector>

#include "xla_spawn/runtime/tensor.h"

namespace xs {

// Scales the parameters' gradients in place (set_grad); returns the norm before clipping.
Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
// The same on a gradient list (undefined entries skipped), e.g. between Optimizer::gradients()
// and Optimizer::apply().
Tensor clip_gradients(std::vector<Tensor>& grads, double max_norm);
// The parts, for gradients held in pieces: the f32 sum of squares of a list (undefined when
// every entry is), and the scaling by min(1, max_norm / (norm + 1e-6)) given the whole sum
// (the sharded update all-reduces its chunk's sum first); returns the norm.
Tensor sum_of_squares(const std::vector<Tensor>& grads);
Tensor clip_to_norm(std::vector<Tensor>& grads, const Tensor& sum_of_squares, double max_norm);

}  // namespace xs
