#include "xla_spawn/collectives/detail/reduce_avx2.h"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace xs::detail {
namespace {

// Vector and scalar views of one element type. max/min take (next, acc) so that they
// compute `next > acc ? next : acc` (resp. <), signed zeros included: maxps(x, y) is exactly
// `x > y ? x : y`; combine() then makes a NaN win, as the portable kernels do.
// T: the stored element; S: the scalar it is computed in (the tail); widen / narrow between.
struct F32 {
  using T = float;
  using S = float;
  using V = __m256;
  static S widen(T v) { return v; }
  static T narrow(S v) { return v; }
  static constexpr size_t kLanes = 8;
  [[gnu::target("avx2")]] static V load(const T* p) { return _mm256_loadu_ps(p); }
  [[gnu::target("avx2")]] static void store(T* p, V v) { _mm256_storeu_ps(p, v); }
  [[gnu::target("avx2")]] static V add(V a, V b) { return _mm256_add_ps(a, b); }
  [[gnu::target("avx2")]] static V max(V next, V acc) { return _mm256_max_ps(next, acc); }
  [[gnu::target("avx2")]] static V min(V next, V acc) { return _mm256_min_ps(next, acc); }
  [[gnu::target("avx2")]] static V div(V a, V d) { return _mm256_div_ps(a, d); }
  [[gnu::target("avx2")]] static V splat(T v) { return _mm256_set1_ps(v); }
};
struct F64 {
  using T = double;
  using S = double;
  using V = __m256d;
  static S widen(T v) { return v; }
  static T narrow(S v) { return v; }
  static constexpr size_t kLanes = 4;
  [[gnu::target("avx2")]] static V load(const T* p) { return _mm256_loadu_pd(p); }
  [[gnu::target("avx2")]] static void store(T* p, V v) { _mm256_storeu_pd(p, v); }
  [[gnu::target("avx2")]] static V add(V a, V b) { return _mm256_add_pd(a, b); }
  [[gnu::target("avx2")]] static V max(V next, V acc) { return _mm256_max_pd(next, acc); }
  [[gnu::target("avx2")]] static V min(V next, V acc) { return _mm256_min_pd(next, acc); }
  [[gnu::target("avx2")]] static V div(V a, V d) { return _mm256_div_pd(a, d); }
  [[gnu::target("avx2")]] static V splat(T v) { return _mm256_set1_pd(v); }
};

// bf16 computed in f32 and rounded once on store, exactly as BF16::from_float rounds: to
// nearest even, a NaN kept as a quiet NaN of the same sign and high payload.
struct BF16x8 {
  using T = uint16_t;
  using S = float;
  using V = __m256;
  static constexpr size_t kLanes = 8;
  static S widen(T v) { return BF16{v}.to_float(); }
  static T narrow(S v) { return BF16::from_float(v).bits; }
  [[gnu::target("avx2")]] static V load(const T* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  [[gnu::target("avx2")]] static void store(T* p, V v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    // |u| > infinity's bits: a NaN (a signed compare is right, both sides are below 2^31).
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i bits = _mm256_blendv_epi8(rounded, quiet, nan);
    // Each 32-bit lane holds a value below 2^16: pack without saturating, lanes 0-3 and 4-7
    // brought together from the two 128-bit halves.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0b1000);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  [[gnu::target("avx2")]] static V add(V a, V b) { return _mm256_add_ps(a, b); }
  [[gnu::target("avx2")]] static V max(V next, V acc) { return _mm256_max_ps(next, acc); }
  [[gnu::target("avx2")]] static V min(V next, V acc) { return _mm256_min_ps(next, acc); }
  [[gnu::target("avx2")]] static V div(V a, V d) { return _mm256_div_ps(a, d); }
  [[gnu::target("avx2")]] static V splat(S v) { return _mm256_set1_ps(v); }
};

enum class Kind { kSum, kMean, kMax, kMin };

// acc if it is a NaN, else next if it is one, else `picked`: max and min keep a NaN from
// any source, as the portable kernels do.
[[gnu::target("avx2"), gnu::always_inline]] inline __m256 nan_wins(__m256 picked, __m256 acc, __m256 next) {
  const __m256 with_next = _mm256_blendv_ps(picked, next, _mm256_cmp_ps(next, next, _CMP_UNORD_Q));
  return _mm256_blendv_ps(with_next, acc, _mm256_cmp_ps(acc, acc, _CMP_UNORD_Q));
}
[[gnu::target("avx2"), gnu::always_inline]] inline __m256d nan_wins(__m256d picked, __m256d acc, __m256d next) {
  const __m256d with_next = _mm256_blendv_pd(picked, next, _mm256_cmp_pd(next, next, _CMP_UNORD_Q));
  return _mm256_blendv_pd(with_next, acc, _mm256_cmp_pd(acc, acc, _CMP_UNORD_Q));
}

template <class E, Kind kKind, class X>
[[gnu::target("avx2"), gnu::always_inline]] inline X combine(X acc, X next) {
  if constexpr (kKind == Kind::kMax) {
    return nan_wins(E::max(next, acc), acc, next);
  } else if constexpr (kKind == Kind::kMin) {
    return nan_wins(E::min(next, acc), acc, next);
  } else {
    return E::add(acc, next);
  }
}

template <class T, Kind kKind>
T combine_scalar(T acc, T next) {
  if constexpr (kKind == Kind::kMax) {
    return acc != acc ? acc : next != next || next > acc ? next : acc;
  } else if constexpr (kKind == Kind::kMin) {
    return acc != acc ? acc : next != next || next < acc ? next : acc;
  } else {
    return acc + next;
  }
}

// K sources known at compile time: the loop over sources unrolls. dst may equal a source
// (element i is loaded from every source before it is stored), but must not partly overlap.
template <class E, Kind kKind, int K>
[[gnu::target("avx2")]] void reduce_k(typename E::T* dst, typename E::T* dst2,
                                      const void* const* sources, size_t n, int divisor) {
  using T = typename E::T;
  using S = typename E::S;
  const T* src[K];
  for (int k = 0; k < K; ++k) src[k] = static_cast<const T*>(sources[k]);
  const typename E::V d = E::splat(static_cast<S>(divisor));
  size_t i = 0;
  for (; i + E::kLanes <= n; i += E::kLanes) {
    auto acc = E::load(src[0] + i);
    for (int k = 1; k < K; ++k) acc = combine<E, kKind>(acc, E::load(src[k] + i));
    if constexpr (kKind == Kind::kMean) acc = E::div(acc, d);
    E::store(dst + i, acc);
    if (dst2 != nullptr) E::store(dst2 + i, acc);
  }
  // The tail element by element, through memcpy: an operand need not be aligned to its
  // element (a NumPy view at an odd offset), and the vector loads above do not care either.
  const auto load = [](const T* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  for (; i < n; ++i) {
    S acc = E::widen(load(src[0] + i));
    for (int k = 1; k < K; ++k) acc = combine_scalar<S, kKind>(acc, E::widen(load(src[k] + i)));
    if constexpr (kKind == Kind::kMean) acc = acc / static_cast<S>(divisor);
    const T out = E::narrow(acc);
    std::memcpy(dst + i, &out, sizeof out);
    if (dst2 != nullptr) std::memcpy(dst2 + i, &out, sizeof out);
  }
}

template <class E, Kind kKind>
bool reduce_kind(void* dst, void* dst2, const void* const* sources, int n_sources, size_t n,
                 int divisor) {
  using T = typename E::T;
  auto* out = static_cast<T*>(dst);
  auto* out2 = static_cast<T*>(dst2);
  switch (n_sources) {
    case 2:
      return reduce_k<E, kKind, 2>(out, out2, sources, n, divisor), true;
    case 3:
      return reduce_k<E, kKind, 3>(out, out2, sources, n, divisor), true;
    case 4:
      return reduce_k<E, kKind, 4>(out, out2, sources, n, divisor), true;
    case 5:
      return reduce_k<E, kKind, 5>(out, out2, sources, n, divisor), true;
    case 6:
      return reduce_k<E, kKind, 6>(out, out2, sources, n, divisor), true;
    case 7:
      return reduce_k<E, kKind, 7>(out, out2, sources, n, divisor), true;
    case 8:
      return reduce_k<E, kKind, 8>(out, out2, sources, n, divisor), true;
    default:
      return false;
  }
}

template <class E>
bool reduce_elem(void* dst, void* dst2, const void* const* sources, int n_sources, size_t n,
                 ReduceOp op, int divisor) {
  switch (op) {
    case ReduceOp::kSum:
      return reduce_kind<E, Kind::kSum>(dst, dst2, sources, n_sources, n, divisor);
    case ReduceOp::kMean:
      return reduce_kind<E, Kind::kMean>(dst, dst2, sources, n_sources, n, divisor);
    case ReduceOp::kMax:
      return reduce_kind<E, Kind::kMax>(dst, dst2, sources, n_sources, n, divisor);
    case ReduceOp::kMin:
      return reduce_kind<E, Kind::kMin>(dst, dst2, sources, n_sources, n, divisor);
  }
  return false;
}

}  // namespace

bool reduce_avx2(void* dst, void* dst2, const void* const* sources, int n_sources, size_t n_elems,
                 DType dtype, ReduceOp op, int divisor) {
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  if (!has_avx2) return false;
  if (dtype == DType::kF32)
    return reduce_elem<F32>(dst, dst2, sources, n_sources, n_elems, op, divisor);
  if (dtype == DType::kF64)
    return reduce_elem<F64>(dst, dst2, sources, n_sources, n_elems, op, divisor);
  if (dtype == DType::kBF16)
    return reduce_elem<BF16x8>(dst, dst2, sources, n_sources, n_elems, op, divisor);
  return false;
}

}  // namespace xs::detail
