#pragma once
// Unit-stride convolution by kernel rows (kernels/linalg.cpp): instead of the full im2col matrix
// (c*kh*kw rows), one matrix X of c*kw rows over all oh + kh - 1 padded input rows; kernel row
// i's patch matrix is X shifted by i output rows (a strided view, ld = (oh + kh - 1) * ow), so
// the convolution is kh GEMMs with k = c*kw and X is kh times smaller than im2col's matrix.
//
//   const RowGeom g = row_geom(xs, ws, p);                  // when use_rows(p, c, kw)
//   reorder_weights(w, g, wr); rows_matrix(x, g, X, pad);   // per sample: X
//   rows_forward(wr, X, g, y);                              // y[o][oy*ow + ox]
#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "xla_spawn/runtime/kernels/im2col.h"

namespace xs::detail {

// Below this k per GEMM (c*kw) the kernel-row GEMMs are too thin: use im2col (conv1 of the
// CNN, c*kw = 5) there.
inline constexpr int64_t kRowsMinK = 64;

inline bool use_rows(const int64_t* p, int64_t c, int64_t kw) {
  return p[0] == 1 && p[1] == 1 && c * kw >= kRowsMinK;
}

struct RowGeom {
  int64_t c, h, w, o, kh, kw, ph, pw, oh, ow;
  int64_t ny() const { return oh + kh - 1; }  // padded input rows X covers
  int64_t ldx() const { return ny() * ow; }   // X's row length
  int64_t kr() const { return c * kw; }       // X's rows: k of each GEMM
  int64_t np() const { return oh * ow; }      // output positions
};

// C = alpha op(A) op(B) + beta C, row-major with explicit leading dimensions.
template <typename T>
void gemm_ld(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
             int64_t ldb, T beta, T* c, int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  const auto to = [](bool t) { return t ? CblasTrans : CblasNoTrans; };
  const auto bi = [](int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, to(ta), to(tb), bi(m), bi(n), bi(k), 1.0f, a, bi(lda), b, bi(ldb),
                beta, c, bi(ldc));
  else
    cblas_dgemm(CblasRowMajor, to(ta), to(tb), bi(m), bi(n), bi(k), 1.0, a, bi(lda), b, bi(ldb),
                beta, c, bi(ldc));
}

// wr[i][o][ci*kw + j] = w[o][ci][i][j]: kernel row i's weights as one o x kr matrix. Loops in
// wr's order: kernel row outermost, so neither side jumps a whole o x kr block per element.
template <typename T>
void reorder_weights(const T* w, const RowGeom& g, T* wr) {
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t ci = 0; ci < g.c; ++ci)
        for (int64_t j = 0; j < g.kw; ++j)
          wr[(i * g.o + o) * g.kr() + ci * g.kw + j] = w[((o * g.c + ci) * g.kh + i) * g.kw + j];
}

// The inverse: w[o][ci][i][j] = wr[i][o][ci*kw + j].
template <typename T>
void unorder_weights(const T* wr, const RowGeom& g, T* w) {
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t ci = 0; ci < g.c; ++ci)
        for (int64_t j = 0; j < g.kw; ++j)
          w[((o * g.c + ci) * g.kh + i) * g.kw + j] = wr[(i * g.o + o) * g.kr() + ci * g.kw + j];
}

#ifdef __AVX512F__
// rows_matrix for f32 rows of at most 16 (input and output): each input row is loaded once and
// its kw shifted copies (X rows ci*kw + j) are made from that register by permutes; im2col
// loaded every row once per kernel column, and those loads were its time.
inline void rows_matrix_narrow(const float* x, const RowGeom& g, float* X, bool again) {
  __m512i shift[16];
  __mmask16 keep[16];
  for (int64_t j = 0; j < g.kw; ++j) {
    alignas(64) int32_t lanes[16];
    keep[j] = 0;
    for (int64_t l = 0; l < 16; ++l) {
      const int64_t col = l + j - g.pw;  // the input column lane l of X row j reads
      lanes[l] = static_cast<int32_t>(std::clamp<int64_t>(col, 0, 15));
      if (col >= 0 && col < g.w && l < g.ow) keep[j] |= static_cast<__mmask16>(1u << l);
    }
    shift[j] = _mm512_load_si512(lanes);
  }
  const int64_t ld = g.ldx();
  const __mmask16 row = static_cast<__mmask16>((1u << g.w) - 1);
  const __mmask16 out = static_cast<__mmask16>((1u << g.ow) - 1);
  for (int64_t ci = 0; ci < g.c; ++ci)
    for (int64_t y = 0; y < g.ny(); ++y) {
      float* dst = X + ci * g.kw * ld + y * g.ow;
      const int64_t iy = y - g.ph;
      if (iy < 0 || iy >= g.h) {  // a padding row: its zeros stand from the previous sample
        for (int64_t j = 0; j < g.kw && !again; ++j)
          _mm512_mask_storeu_ps(dst + j * ld, out, _mm512_setzero_ps());
        continue;
      }
      const __m512 r = _mm512_maskz_loadu_ps(row, x + (ci * g.h + iy) * g.w);
      for (int64_t j = 0; j < g.kw; ++j)
        _mm512_mask_storeu_ps(dst + j * ld, out, _mm512_maskz_permutexvar_ps(keep[j], shift[j], r));
    }
}
#endif

// X[ci*kw + j][y*ow + ox] = x[ci][y - ph][ox + j - pw] (0 outside), y < ny: im2col with a
// one-row kernel over ny output rows. `pad` as for im2col with these arguments; `again`: X
// holds the previous sample's matrix (same geometry), whose zero padding rows are kept.
template <typename T>
void rows_matrix(const T* x, const RowGeom& g, T* X, T* pad, bool again = false) {
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, float>) {
    if (g.w <= 16 && g.ow <= 16 && g.kw <= 16) return rows_matrix_narrow(x, g, X, again);
  }
#endif
  const int64_t p[4] = {1, 1, g.ph, g.pw};
  im2col(x, g.c, g.h, g.w, 1, g.kw, p, g.ny(), g.ow, X, pad, again);
}

// y[o][p] = sum over i of wr_i X_i (kernel row i's patch matrix is X from column i*ow).
template <typename T>
void rows_forward(const T* wr, const T* X, const RowGeom& g, T* y) {
  for (int64_t i = 0; i < g.kh; ++i)
    gemm_ld<T>(false, false, g.o, g.np(), g.kr(), wr + i * g.o * g.kr(), g.kr(), X + i * g.ow,
               g.ldx(), i == 0 ? T(0) : T(1), y, g.np());
}

// dwr_i (+)= gy X_i^T for each kernel row i (beta 0 for the first sample).
template <typename T>
void rows_grad_weight(const T* gy, const T* X, const RowGeom& g, bool first, T* dwr) {
  for (int64_t i = 0; i < g.kh; ++i)
    gemm_ld<T>(false, true, g.o, g.kr(), g.np(), gy, g.np(), X + i * g.ow, g.ldx(),
               first ? T(0) : T(1), dwr + i * g.o * g.kr(), g.kr());
}

// The input gradient of one sample: Z = sum over i of (wr_i^T gy) placed from column i*ow (the
// adjoint of rows_forward's views), then dx[ci][y][x] = sum over j of Z[ci*kw + j] at padded
// row y + ph, column x + pw - j (the adjoint of rows_matrix). Z is kr x ldx scratch.
template <typename T>
void rows_grad_input(const T* wr, const T* gy, const RowGeom& g, T* Z, T* dx) {
  for (int64_t r = 0; r < g.kr(); ++r)
    std::fill(Z + r * g.ldx() + g.np(), Z + (r + 1) * g.ldx(), T(0));
  for (int64_t i = 0; i < g.kh; ++i)
    gemm_ld<T>(true, false, g.kr(), g.np(), g.o, wr + i * g.o * g.kr(), g.kr(), gy, g.np(),
               i == 0 ? T(0) : T(1), Z + i * g.ow, g.ldx());
  // col2im with a one-row kernel: Z's rows are ny * ow long, input row y reads padded row y + ph.
  col2im_unit_direct(Z + g.ph * g.ow, g.c, g.h, g.w, 1, g.kw, 0, g.pw, g.ny(), g.ow, dx);
}

}  // namespace xs::detail
