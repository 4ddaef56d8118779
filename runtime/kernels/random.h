#pragma once
// The counter-based random numbers: element i of rand_uniform, rand_normal or bernoulli is a
// pure function of (seed, i) through splitmix64, so a value does not depend on blocking or
// order, the same seed always reproduces the same tensor, and a loop may compute an element
// again instead of reading it back (a dropout mask in the backward). One formula for the op
// kernel and the loop interpreter; the generated code (compiler/codegen.cpp) repeats it
// operation for operation.
//
//   const double v = random_value(Op::kBernoulli, DType::kF32, seed, i, 0.9);  // 1 or 0
#include <cmath>
#include <cstdint>
#include <numbers>

#include "xla_spawn/runtime/hash.h"
#include "xla_spawn/runtime/op.h"

namespace xs::detail {

inline constexpr uint64_t kRandomIndexSalt = 0xa5a5a5a5ull;

// The draw for element i: mix64(mix64(seed) ^ mix64(i ^ salt)).
inline uint64_t random_draw(uint64_t seed, uint64_t i) { return mix64(mix64(seed) ^ mix64(i ^ kRandomIndexSalt)); }

// The top 53 bits as a double in [0, 1).
inline double random_unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

// The smallest uniform value that would round up to 1 in `dt` (f32: 1 - 2^-25, bf16:
// 1 - 2^-9); none for f64, which holds every value below 1.
inline double random_uniform_top(DType dt) {
  return dt == DType::kF32 ? 1.0 - 0x1.0p-25 : dt == DType::kBF16 ? 1.0 - 0x1.0p-9 : 2.0;
}

// Element i of a draw of `op` whose result has dtype `dt`, as a double (then converted to the
// result's dtype as any double is: to f32, and from there rounded to bf16). Uniform values
// that would round up to 1 in f32 (or bf16) are 0, so the result stays in [0, 1); normal is
// Box-Muller on draws 2i and 2i + 1; bernoulli is 1 with probability p.
inline double random_value(Op op, DType dt, uint64_t seed, uint64_t i, double p) {
  if (op == Op::kRandUniform) {
    const double v = random_unit(random_draw(seed, i));
    return v >= random_uniform_top(dt) ? 0 : v;
  }
  if (op == Op::kRandNormal) {
    const double u1 = 1.0 - random_unit(random_draw(seed, 2 * i)), u2 = random_unit(random_draw(seed, 2 * i + 1));
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  return random_unit(random_draw(seed, i)) < p ? 1.0 : 0.0;
}

}  // namespace xs::detail
