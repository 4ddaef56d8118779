#pragma once
// One-pass AVX2 reduction of f32/f64/bf16 sum, mean, max and min, the dtypes and ops gradients
// use (bf16 computed in f32 and rounded once): each result element is computed in registers from all sources and stored once (no
// accumulator block in L1), with exactly the arithmetic of the portable kernels in
// collectives/reduce.cpp, so results are bit-identical whichever kernel ran.
//
//   if (detail::reduce_avx2(dst, dst2, sources, n, n_elems, dtype, op, divisor)) return;

#include <cstddef>

#include "xla_spawn/base/dtype.h"

namespace xs::detail {

// Does what reduce_sources does (non-streaming) and returns true, or returns false without
// touching anything when the CPU lacks AVX2 or (dtype, op, n_sources) is not covered.
bool reduce_avx2(void* dst, void* dst2, const void* const* sources, int n_sources, size_t n_elems,
                 DType dtype, ReduceOp op, int divisor);

}  // namespace xs::detail
