#pragma once
// Parameter initialisation as PyTorch does it by default, drawn from a seeded Generator.
// Linear and Conv2d weights: kaiming_uniform(a = sqrt(5)), i.e. U(-1/sqrt(fan_in), ..);
// their biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
//
//   Tensor w = kaiming_uniform({512, 784}, /*fan_in=*/784, gen);

#include <cstdint>

#include "xla_spawn/runtime/nn/generator.h"
#include "xla_spawn/runtime/tensor.h"

namespace xs {

// A materialised f32 tensor of `shape` with values U(lo, hi), drawn in row-major order.
Tensor uniform_tensor(const Shape& shape, double lo, double hi, Generator& gen);

// A materialised f32 tensor of `shape` with values N(mean, std), by Box-Muller on pairs of
// uniform draws, in row-major order (GPT-2's initialisation uses N(0, 0.02)).
Tensor normal_tensor(const Shape& shape, double mean, double std, Generator& gen);

// PyTorch's kaiming_uniform_(a, mode=fan_in, nonlinearity=leaky_relu): bound =
// sqrt(2 / (1 + a^2)) * sqrt(3 / fan_in).
Tensor kaiming_uniform(const Shape& shape, int64_t fan_in, Generator& gen,
                       double a = 2.23606797749979);

// Glorot (Xavier) uniform: bound = gain * sqrt(6 / (fan_in + fan_out)).
Tensor xavier_uniform(const Shape& shape, int64_t fan_in, int64_t fan_out, Generator& gen,
                      double gain = 1);

}  // namespace xs
