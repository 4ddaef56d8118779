#include "xla_spawn/collectives/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/collectives/detail/reduce_avx2.h"
#include "xla_spawn/collectives/detail/stream_copy.h"

namespace xs {
namespace {

// Elements per accumulator block: 2048 x 8 bytes stays in L1 while N sources stream through.
constexpr size_t kBlock = 2048;

template <class Storage, class Acc>
struct Plain {
  using T = Storage;
  using A = Acc;
  static A load(T v) { return static_cast<A>(v); }
  static T store(A v) { return static_cast<T>(v); }
};
struct BF16Traits {
  using T = uint16_t;
  using A = float;
  static A load(T v) { return BF16{v}.to_float(); }
  static T store(A v) { return BF16::from_float(v).bits; }
};

template <class A>
A wrapping_add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
struct SumOp {
  template <class A>
  static A apply(A a, A b) {
    return wrapping_add(a, b);
  }
};
// Max and min keep a NaN from any source (a itself if it is one, else b if it is): which
// ordinal holds it must not decide whether a divergence check sees it. Otherwise `b > a ? b :
// a` (resp. <), so of two equal values (+0 and -0) the earlier source's wins.
struct MaxOp {
  template <class A>
  static A apply(A a, A b) {
    return a != a ? a : b != b || b > a ? b : a;
  }
};
struct MinOp {
  template <class A>
  static A apply(A a, A b) {
    return a != a ? a : b != b || b < a ? b : a;
  }
};

template <class Tr, class F>
void dispatch_op(ReduceOp op, F& f) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return f.template operator()<Tr, SumOp>();
    case ReduceOp::kMax:
      return f.template operator()<Tr, MaxOp>();
    case ReduceOp::kMin:
      return f.template operator()<Tr, MinOp>();
  }
  throw InternalError(fmt::format("reduce: unknown op {}", static_cast<int>(op)));
}

template <class F>
void dispatch(DType dtype, ReduceOp op, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return dispatch_op<Plain<float, float>>(op, f);
    case DType::kF64:
      return dispatch_op<Plain<double, double>>(op, f);
    case DType::kBF16:
      return dispatch_op<BF16Traits>(op, f);
    case DType::kI32:
      return dispatch_op<Plain<int32_t, int32_t>>(op, f);
    case DType::kI64:
      return dispatch_op<Plain<int64_t, int64_t>>(op, f);
    case DType::kBool:
      break;
  }
  throw InvalidArgument(fmt::format("reduce: dtype {} cannot be reduced", dtype_name(dtype)));
}

// out[i] = store(acc[i] / divisor) or store(acc[i]); the divide keeps sum-then-divide exact
// where the sum is (a reciprocal multiply would round differently).
template <class Tr>
void finish_block(typename Tr::T* out, const typename Tr::A* __restrict acc, size_t n, bool mean,
                  int divisor) {
  using A = typename Tr::A;
  if (mean) {
    const A d = static_cast<A>(divisor);
    for (size_t i = 0; i < n; ++i) out[i] = Tr::store(acc[i] / d);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = Tr::store(acc[i]);
  }
}

}  // namespace

size_t accumulator_size(DType dtype) {
  return dtype == DType::kBF16 ? 4 : dtype_size(dtype);
}

void check_reducible(const char* operation, DType dtype, ReduceOp op) {
  check_dtype(operation, dtype);
  if (static_cast<int>(op) >= kNumReduceOps) {
    throw InvalidArgument(fmt::format("{}: reduce op code {} is not a reduce op (0..{})",
                                      operation, static_cast<int>(op), kNumReduceOps - 1));
  }
  if (dtype == DType::kBool) {
    throw InvalidArgument(
        fmt::format("{}: dtype bool cannot be reduced (expected f32, f64, "
                    "bf16, i32 or i64)",
                    operation));
  }
}

namespace {

// All K sources in one pass per element, accumulating in a register: one read per source
// element and one write per result, the minimum memory traffic (K known at compile time
// so the loop over sources unrolls and the loop over elements vectorises).
template <class Tr, class Op, int K>
void reduce_fixed(typename Tr::T* dst, typename Tr::T* dst2, const void* const* sources,
                  size_t n_elems, bool mean, int divisor, bool streaming) {
  using T = typename Tr::T;
  using A = typename Tr::A;
  const T* src[K];
  for (int k = 0; k < K; ++k) src[k] = static_cast<const T*>(sources[k]);
  const A d = static_cast<A>(divisor);
  for (size_t base = 0; base < n_elems; base += kBlock) {
    const size_t n = std::min(kBlock, n_elems - base);
    A acc[kBlock];
    for (size_t i = 0; i < n; ++i) {
      A a = Tr::load(src[0][base + i]);
      for (int k = 1; k < K; ++k) a = Op::apply(a, Tr::load(src[k][base + i]));
      acc[i] = a;
    }
    // Written after the block is read: dst may be one of the sources.
    // Streaming goes through an L1 block: non-temporal stores want whole aligned lines.
    T block[kBlock];
    T* out = streaming ? block : dst + base;
    if (mean) {
      for (size_t i = 0; i < n; ++i) out[i] = Tr::store(acc[i] / d);
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = Tr::store(acc[i]);
    }
    if (streaming) detail::copy_out(dst + base, block, n * sizeof(T), true);
    if (dst2 != nullptr) std::memcpy(dst2 + base, out, n * sizeof(T));
  }
}

// Any number of sources: accumulate a block source by source.
template <class Tr, class Op>
void reduce_many(typename Tr::T* dst, typename Tr::T* dst2, const void* const* sources,
                 int n_sources, size_t n_elems, bool mean, int divisor, bool streaming) {
  using T = typename Tr::T;
  using A = typename Tr::A;
  A acc[kBlock];
  for (size_t base = 0; base < n_elems; base += kBlock) {
    const size_t n = std::min(kBlock, n_elems - base);
    const T* s0 = static_cast<const T*>(sources[0]) + base;
    for (size_t i = 0; i < n; ++i) acc[i] = Tr::load(s0[i]);
    for (int j = 1; j < n_sources; ++j) {
      const T* __restrict s = static_cast<const T*>(sources[j]) + base;
      for (size_t i = 0; i < n; ++i) acc[i] = Op::apply(acc[i], Tr::load(s[i]));
    }
    T block[kBlock];
    T* out = streaming ? block : dst + base;
    finish_block<Tr>(out, acc, n, mean, divisor);
    if (streaming) detail::copy_out(dst + base, block, n * sizeof(T), true);
    if (dst2 != nullptr) std::memcpy(dst2 + base, out, n * sizeof(T));
  }
}

}  // namespace

void reduce_sources(void* dst, void* dst2, const void* const* sources, int n_sources,
                    size_t n_elems, DType dtype, ReduceOp op, int divisor, bool streaming) {
  if (!streaming &&
      detail::reduce_avx2(dst, dst2, sources, n_sources, n_elems, dtype, op, divisor)) {
    return;
  }
  const bool mean = op == ReduceOp::kMean;
  dispatch(dtype, op, [&]<class Tr, class Op>() {
    using T = typename Tr::T;
    auto* out = static_cast<T*>(dst);
    auto* out2 = static_cast<T*>(dst2);
    switch (n_sources) {
      case 1:
        return reduce_fixed<Tr, Op, 1>(out, out2, sources, n_elems, mean, divisor, streaming);
      case 2:
        return reduce_fixed<Tr, Op, 2>(out, out2, sources, n_elems, mean, divisor, streaming);
      case 3:
        return reduce_fixed<Tr, Op, 3>(out, out2, sources, n_elems, mean, divisor, streaming);
      case 4:
        return reduce_fixed<Tr, Op, 4>(out, out2, sources, n_elems, mean, divisor, streaming);
      case 5:
        return reduce_fixed<Tr, Op, 5>(out, out2, sources, n_elems, mean, divisor, streaming);
      case 6:
        return reduce_fixed<Tr, Op, 6>(out, out2, sources, n_elems, mean, divisor, streaming);
      case 7:
        return reduce_fixed<Tr, Op, 7>(out, out2, sources, n_elems, mean, divisor, streaming);
      case 8:
        return reduce_fixed<Tr, Op, 8>(out, out2, sources, n_elems, mean, divisor, streaming);
      default:
        return reduce_many<Tr, Op>(out, out2, sources, n_sources, n_elems, mean, divisor,
                                   streaming);
    }
  });
}

void ring_start(void* acc_out, const void* own, size_t n_elems, DType dtype) {
  dispatch(dtype, ReduceOp::kSum, [&]<class Tr, class Op>() {
    auto* __restrict out = static_cast<typename Tr::A*>(acc_out);
    const auto* __restrict in = static_cast<const typename Tr::T*>(own);
    for (size_t i = 0; i < n_elems; ++i) out[i] = Tr::load(in[i]);
  });
}

void ring_accumulate(void* acc_out, const void* acc_in, const void* own, size_t n_elems,
                     DType dtype, ReduceOp op) {
  dispatch(dtype, op, [&]<class Tr, class Op>() {
    auto* __restrict out = static_cast<typename Tr::A*>(acc_out);
    const auto* __restrict partial = static_cast<const typename Tr::A*>(acc_in);
    const auto* __restrict mine = static_cast<const typename Tr::T*>(own);
    for (size_t i = 0; i < n_elems; ++i) out[i] = Op::apply(partial[i], Tr::load(mine[i]));
  });
}

void ring_finish(void* dst, void* dst2, const void* acc_in, const void* own, size_t n_elems,
                 DType dtype, ReduceOp op, int divisor) {
  const bool mean = op == ReduceOp::kMean;
  dispatch(dtype, op, [&]<class Tr, class Op>() {
    using T = typename Tr::T;
    using A = typename Tr::A;
    A acc[kBlock];
    for (size_t base = 0; base < n_elems; base += kBlock) {
      const size_t n = std::min(kBlock, n_elems - base);
      const A* partial = static_cast<const A*>(acc_in) + base;
      const T* mine = static_cast<const T*>(own) + base;
      for (size_t i = 0; i < n; ++i) acc[i] = Op::apply(partial[i], Tr::load(mine[i]));
      T* out = static_cast<T*>(dst) + base;
      finish_block<Tr>(out, acc, n, mean, divisor);
      if (dst2 != nullptr) std::memcpy(static_cast<T*>(dst2) + base, out, n * sizeof(T));
    }
  });
}

}  // namespace xs
