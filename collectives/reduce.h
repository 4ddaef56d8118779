#pragma once
// Element-wise reduction kernels for the collectives, in one fixed order so results are
// bit-identical wherever they are computed. bf16 accumulates in f32 and rounds once; mean
// is sum then divide (integers: C++ integer division, truncating toward zero); integer sums
// wrap (two's complement) instead of overflowing.
//
//   const void* sources[] = {a, b, c};                  // ordinal order
//   xs::reduce_sources(out, nullptr, sources, 3, n, DType::kF32, ReduceOp::kMean, 3);
//
// Bool is rejected (xs::InvalidArgument): the reductions are defined for numbers only.
// f32/f64/bf16 with 2..8 sources run one-pass AVX2 kernels where the CPU has AVX2
// (collectives/detail/reduce_avx2.h), with the same arithmetic bit for bit.

#include <cstddef>

#include "xla_spawn/base/dtype.h"

namespace xs {

// Bytes per element of the accumulator: 4 for bf16 (f32), else dtype_size.
size_t accumulator_size(DType dtype);

// Throws xs::InvalidArgument naming `operation` when dtype cannot be reduced, or when dtype
// or op is a code outside its enum (an integer cast carelessly).
void check_reducible(const char* operation, DType dtype, ReduceOp op);

// dst[i] = finish(((src[0][i] op src[1][i]) op src[2][i]) ... op src[n-1][i]), where finish
// divides by `divisor` for kMean and rounds bf16. dst may be exactly one of the sources;
// dst2, when not null, receives a copy of the result and may be exactly another source
// (every kernel reads element i, or its whole block, from all sources before storing it). `streaming` writes dst with
// non-temporal stores (see collectives/detail/stream_copy.h).
void reduce_sources(void* dst, void* dst2, const void* const* sources, int n_sources,
                    size_t n_elems, DType dtype, ReduceOp op, int divisor, bool streaming = false);

// Ring steps, on accumulator-typed partials (see accumulator_size):
// acc_out[i] = acc(own[i]).
void ring_start(void* acc_out, const void* own, size_t n_elems, DType dtype);
// acc_out[i] = acc_in[i] op acc(own[i]).
void ring_accumulate(void* acc_out, const void* acc_in, const void* own, size_t n_elems,
                     DType dtype, ReduceOp op);
// dst[i] = finish(acc_in[i] op acc(own[i])), dst2 (if not null) a copy; dst may alias own.
void ring_finish(void* dst, void* dst2, const void* acc_in, const void* own, size_t n_elems,
                 DType dtype, ReduceOp op, int divisor);

}  // namespace xs
