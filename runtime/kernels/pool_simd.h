#pragma once
// The window choices shared by the 2x2 max-pool kernels (kernels/pool.cpp): the running-maximum
// rule (first maximum wins, a NaN takes over), the pooled input relu(x + bias), and their
// AVX-512 forms on 16 windows at once (bit for bit the scalar ones).
//
//   const bool right = takes_over(a, b);  // b becomes the window's maximum
#include <immintrin.h>

#include <cstdint>

namespace xs::detail {

// NaN-propagating max (the first NaN wins), branch-free enough to vectorise.
// Whether b replaces a as the running maximum: larger, or NaN over a non-NaN (the first NaN
// wins). Bitwise & and |: no branches.
template <typename T>
inline bool takes_over(T a, T b) {
  return ((b > a) | (b != b)) & (a == a);
}

// The same choice as three selects on plain comparisons, which the compiler turns into vector
// compare-and-blend.
template <typename T>
inline T nan_max(T a, T b) {
  T m = b > a ? b : a;
  m = b != b ? b : m;
  return a != a ? a : m;
}

// The pooled input value at x: x itself, or relu(x + bias) (as the fused loop computes it).
template <bool kBiasRelu, typename T>
inline T pooled_input(T x, T bias) {
  if constexpr (kBiasRelu) {
    const T v = x + bias;
    return v > 0 ? v : T(0);
  } else {
    return x;
  }
}

#ifdef __AVX512F__
// The lowest n of 16 lanes.
inline __mmask16 first_bits(int64_t n) {
  return n <= 0 ? 0 : n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
}

inline __m512 nan_max16(__m512 a, __m512 b) {  // nan_max, lane by lane
  __m512 m = _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ), b);
  m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q), b);
  return _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
}

// The same choices on 16 windows at once (AVX-512), bit for bit: masks for takes_over, the
// row pairs split into even/odd columns and interleaved back by permutes.
inline __mmask16 takes_over16(__m512 a, __m512 b) {
  return (_mm512_cmp_ps_mask(b, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q)) &
         _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q);
}

template <bool kBiasRelu>
inline __m512 pooled_input16(__m512 x, __m512 bias) {
  if constexpr (!kBiasRelu) return x;
  const __m512 v = _mm512_add_ps(x, bias);
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ), v);
}

// Writes four window gradients per lane (ga..gd: top-left, top-right, bottom-left,
// bottom-right) back into the two rows, interleaved.
inline void store_windows16(float* o0, float* o1, int64_t n, __m512 ga, __m512 gb, __m512 gc,
                            __m512 gd) {
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  const __mmask16 m0 = first_bits(2 * n), m1 = first_bits(2 * n - 16);
  _mm512_mask_storeu_ps(o0, m0, _mm512_permutex2var_ps(ga, lo, gb));
  _mm512_mask_storeu_ps(o0 + 16, m1, _mm512_permutex2var_ps(ga, hi, gb));
  _mm512_mask_storeu_ps(o1, m0, _mm512_permutex2var_ps(gc, lo, gd));
  _mm512_mask_storeu_ps(o1 + 16, m1, _mm512_permutex2var_ps(gc, hi, gd));
}

// The n <= 16 2x2 windows of one row pair (rows x0, x1, from column 0): each window's cells
// a b / c d (after pooled_input) and takes_over's choices between them, lane by lane. The
// forward's argmax and the backward's routing both start here, so they choose alike.
struct Windows2x2x16 {
  __m512 a, b, c, d;
  __mmask16 top_right, bottom_right;  // b beat a; d beat c
  __mmask16 down;                     // the bottom row's winner beat the top row's
  __mmask16 valid;                    // the first n lanes
};

// The choices between cells a b / c d already split into lanes (after pooled_input).
inline Windows2x2x16 choose_cells16(__m512 a, __m512 b, __m512 c, __m512 d, __mmask16 valid) {
  Windows2x2x16 w{a, b, c, d, takes_over16(a, b), takes_over16(c, d), 0, valid};
  w.down = takes_over16(_mm512_mask_mov_ps(w.a, w.top_right, w.b),
                        _mm512_mask_mov_ps(w.c, w.bottom_right, w.d));
  return w;
}

template <bool kBiasRelu>
inline Windows2x2x16 choose_2x2_x16(const float* x0, const float* x1, int64_t n, __m512 bias) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __mmask16 m0 = first_bits(2 * n), m1 = first_bits(2 * n - 16);
  const __m512 t0 = _mm512_maskz_loadu_ps(m0, x0), t1 = _mm512_maskz_loadu_ps(m1, x0 + 16);
  const __m512 u0 = _mm512_maskz_loadu_ps(m0, x1), u1 = _mm512_maskz_loadu_ps(m1, x1 + 16);
  return choose_cells16(pooled_input16<kBiasRelu>(_mm512_permutex2var_ps(t0, even, t1), bias),
                        pooled_input16<kBiasRelu>(_mm512_permutex2var_ps(t0, odd, t1), bias),
                        pooled_input16<kBiasRelu>(_mm512_permutex2var_ps(u0, even, u1), bias),
                        pooled_input16<kBiasRelu>(_mm512_permutex2var_ps(u0, odd, u1), bias),
                        first_bits(n));
}

// Stores the valid lanes' window maxima and argmax positions (0..3, as floats).
inline void store_argmax16(const Windows2x2x16& w, float* val, float* idx) {
  const __m512 top = _mm512_mask_mov_ps(w.a, w.top_right, w.b);
  const __m512 bottom = _mm512_mask_mov_ps(w.c, w.bottom_right, w.d);
  const __mmask16 right = (w.down & w.bottom_right) | (~w.down & w.top_right);
  _mm512_mask_storeu_ps(val, w.valid, _mm512_mask_mov_ps(top, w.down, bottom));
  _mm512_mask_storeu_ps(idx, w.valid,
                        _mm512_add_ps(_mm512_maskz_mov_ps(w.down, _mm512_set1_ps(2.0f)),
                                      _mm512_maskz_mov_ps(right, _mm512_set1_ps(1.0f))));
}

// argmax_2x2 on n <= 16 windows of one row pair (rows x0, x1), bit for bit.
inline void argmax_2x2_x16(const float* x0, const float* x1, int64_t n, __m512 bias, float* val,
                           float* idx) {
  store_argmax16(choose_2x2_x16<true>(x0, x1, n, bias), val, idx);
}

// route_2x2 on n <= 16 windows.
inline void route_2x2_x16(const float* idx, const float* g, int64_t n, float* o0, float* o1) {
  const __mmask16 mg = first_bits(n);
  const __m512 k = _mm512_maskz_loadu_ps(mg, idx), gv = _mm512_maskz_loadu_ps(mg, g);
  const __mmask16 down = _mm512_cmp_ps_mask(k, _mm512_set1_ps(1.5f), _CMP_GT_OQ);
  const __mmask16 right = _mm512_cmp_ps_mask(k, _mm512_set1_ps(1.0f), _CMP_EQ_OQ) |
                          _mm512_cmp_ps_mask(k, _mm512_set1_ps(3.0f), _CMP_EQ_OQ);
  store_windows16(o0, o1, n, _mm512_maskz_mov_ps(~down & ~right, gv),
                  _mm512_maskz_mov_ps(~down & right, gv), _mm512_maskz_mov_ps(down & ~right, gv),
                  _mm512_maskz_mov_ps(down & right, gv));
}

// The same choices over a sample's planes as one flat run (pool_flat.cpp), for narrow planes
// where one row pair fills few of the 16 lanes. Each returns false, having done nothing, for
// a geometry it does not handle; the row-pair kernels above handle every geometry.
// argmax_2x2 taking two row pairs per vector (w <= 16).
bool argmax_2x2_paired(const float* y, const float* bias, int64_t channels, int64_t h, int64_t w,
                       float* val, float* idx);
// route_2x2 writing whole 16-lane vectors of the sample's gradient (w <= 32).
bool route_2x2_flat(const float* idx, const float* g, int64_t channels, int64_t h, int64_t w,
                    float* out);

#endif

}  // namespace xs::detail
