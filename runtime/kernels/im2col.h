#pragma once
// im2col and col2im for the convolution kernels (kernels/linalg.cpp): the patch matrix of one
// NCHW sample, cols[(c*kh + i)*kw + j][oy*ow + ox] = x[c][oy*sh - ph + i][ox*sw - pw + j]
// (0 outside), and its adjoint. Unit stride has fast paths (AVX-512 where built for it).
//
//   std::vector<float> cols(c * kh * kw * oh * ow), pad(im2col_pad_size(c, h, w, p));
//   im2col(x, c, h, w, kh, kw, p, oh, ow, cols.data(), pad.data());  // p = {sh, sw, ph, pw}
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace xs::detail {

// Output columns ox in [lo, hi) read input column ox*s - p + j inside [0, w): bounds are
// worked out once per kernel column, so the copy loops below carry no per-element checks.
inline void valid_range(int64_t w, int64_t s, int64_t p, int64_t j, int64_t ow, int64_t* lo, int64_t* hi) {
  const int64_t first = p - j;  // ox*s >= first
  *lo = first <= 0 ? 0 : (first + s - 1) / s;
  const int64_t last = w - 1 + p - j;  // ox*s <= last
  *hi = last < 0 ? 0 : std::min(ow, last / s + 1);
  if (*hi < *lo) *hi = *lo;
}

// Copies n elements. The runs im2col copies are short (a row of a 14x14 map): fixed-size
// 8-element moves (inlined) instead of a memmove call whose overhead dominates at that length;
// the tail is one more 8-element move overlapping the last full one.
template <typename T>
inline void copy_short(const T* in, int64_t n, T* out) {
  if (n < 8) {
    for (int64_t i = 0; i < n; ++i) {
      out[i] = in[i];
      asm volatile("" ::: "memory");  // keep GCC from turning this loop into a memmove call
    }
    return;
  }
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) std::memcpy(out + i, in + i, 8 * sizeof(T));
  if (i < n) std::memcpy(out + n - 8, in + n - 8, 8 * sizeof(T));
}

// Zeroes a few elements (padding columns) without a memset call.
template <typename T>
inline void zero_short(T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = T(0);
    asm volatile("" ::: "memory");  // as in copy_short
  }
}

// Moves one short run (a row of a 14x14 or 28x28 map): with AVX-512, one masked instruction
// per 16 floats and no scalar tail; otherwise copy_short.
template <typename T>
inline void copy_run(const T* in, int64_t n, T* out) {
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, float>) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, _mm512_loadu_ps(in + i));
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      _mm512_mask_storeu_ps(out + i, m, _mm512_maskz_loadu_ps(m, in + i));
    }
    return;
  }
#endif
  copy_short(in, n, out);
}

// A sample's planes with their zero padding written out, [c][h + 2ph][w + 2pw]: with unit
// stride every im2col row is then one contiguous run, with no bounds or padding cases.
template <typename T>
void pad_planes(const T* x, int64_t c, int64_t h, int64_t w, int64_t ph, int64_t pw, T* pad) {
  const int64_t wp = w + 2 * pw;
  for (int64_t ci = 0; ci < c; ++ci) {
    T* plane = pad + ci * (h + 2 * ph) * wp;
    std::fill(plane, plane + ph * wp, T(0));
    for (int64_t y = 0; y < h; ++y) {
      T* row = plane + (y + ph) * wp;
      zero_short(row, pw);
      copy_run(x + (ci * h + y) * w, w, row + pw);
      zero_short(row + pw + w, pw);
    }
    std::fill(plane + (ph + h) * wp, plane + (2 * ph + h) * wp, T(0));
  }
}

// Unit-stride convolution geometry over padded planes of hp x wp.
struct UnitGeom {
  int64_t c, hp, wp, kh, kw, oh, ow;
};

// im2col over padded planes: cols[(c*kh + i)*kw + j][oy*ow + ox] = pad[c][oy + i][ox + j].
template <typename T>
void im2col_unit(const T* pad, const UnitGeom& g, T* cols) {
  for (int64_t ci = 0; ci < g.c; ++ci)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        T* row = cols + ((ci * g.kh + i) * g.kw + j) * g.oh * g.ow;
        const T* src = pad + (ci * g.hp + i) * g.wp + j;
        for (int64_t oy = 0; oy < g.oh; ++oy) copy_run(src + oy * g.wp, g.ow, row + oy * g.ow);
      }
}

#ifdef __AVX512F__
// Unit-stride f32 im2col straight from the unpadded planes: each run of up to 16 outputs is
// one masked load (lanes outside the plane are not read and come out 0) and one store. No
// padded copy of the sample is made (that pass was a fifth of im2col's time).
// With `zeros_kept`, rows that lie wholly in the padding are left alone: a previous call with
// the same geometry into the same cols already wrote their zeros.
inline void im2col_unit_masked(const float* x, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw,
                               int64_t ph, int64_t pw, int64_t oh, int64_t ow, float* cols,
                               bool zeros_kept = false) {
  const int64_t chunks = (ow + 15) / 16;
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t i = 0; i < kh; ++i)
      for (int64_t j = 0; j < kw; ++j) {
        float* row = cols + ((ci * kh + i) * kw + j) * oh * ow;
        int64_t lo, hi;
        valid_range(w, 1, pw, j, ow, &lo, &hi);
        const float* src = x + ci * h * w - pw + j;  // column ox of row y is src[y * w + ox]
        for (int64_t q = 0; q < chunks; ++q) {
          const int64_t x0 = 16 * q, n = std::min<int64_t>(16, ow - x0);
          const int64_t a = std::clamp<int64_t>(lo - x0, 0, n), b = std::clamp<int64_t>(hi - x0, 0, n);
          const __mmask16 valid = static_cast<__mmask16>(((1u << b) - 1) & ~((1u << a) - 1));
          const __mmask16 all = static_cast<__mmask16>((1u << n) - 1);
          // Rows y = oy - ph + i outside the plane are zero; masked-off lanes are never read,
          // so the base may lie outside the plane.
          const int64_t y_lo = std::max<int64_t>(0, ph - i), y_hi = std::min<int64_t>(oh, h + ph - i);
          for (int64_t oy = 0; oy < (zeros_kept ? 0 : std::min(y_lo, oh)); ++oy)
            _mm512_mask_storeu_ps(row + oy * ow + x0, all, _mm512_setzero_ps());
          for (int64_t oy = y_lo; oy < y_hi; ++oy)
            _mm512_mask_storeu_ps(row + oy * ow + x0, all,
                                  _mm512_maskz_loadu_ps(valid, src + (oy - ph + i) * w + x0));
          for (int64_t oy = zeros_kept ? oh : std::max(y_lo, y_hi); oy < oh; ++oy)
            _mm512_mask_storeu_ps(row + oy * ow + x0, all, _mm512_setzero_ps());
        }
      }
}
#endif

// cols[(c*kh + i)*kw + j][oy*ow + ox] = x[c][oy*sh - ph + i][ox*sw - pw + j] (0 outside).
template <typename T>
void im2col_strided(const T* x, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw,
                    const int64_t* p, int64_t oh, int64_t ow, T* cols) {
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t i = 0; i < kh; ++i)
      for (int64_t j = 0; j < kw; ++j) {
        T* row = cols + ((ci * kh + i) * kw + j) * oh * ow;
        int64_t lo, hi;
        valid_range(w, p[1], p[3], j, ow, &lo, &hi);
        for (int64_t oy = 0; oy < oh; ++oy) {
          const int64_t y = oy * p[0] - p[2] + i;
          T* out = row + oy * ow;
          if (y < 0 || y >= h) {
            std::fill(out, out + ow, T(0));
            continue;
          }
          const int64_t base = (ci * h + y) * w - p[3] + j;  // x[base + ox * sw] is column ox
          zero_short(out, lo);
          if (p[1] == 1) copy_short(x + base + lo, hi - lo, out + lo);
          else for (int64_t ox = lo; ox < hi; ++ox) out[ox] = x[base + ox * p[1]];
          zero_short(out + hi, ow - hi);
        }
      }
}

// Elements of the scratch im2col needs for the padded planes (0 when it needs none).
inline int64_t im2col_pad_size(int64_t c, int64_t h, int64_t w, const int64_t* p) {
  if (p[0] != 1 || p[1] != 1 || (p[2] == 0 && p[3] == 0)) return 0;
  return c * (h + 2 * p[2]) * (w + 2 * p[3]);
}

// im2col of one sample; `pad` is scratch of im2col_pad_size(c, h, w, p) elements for the
// padded planes (unit stride). `zeros_kept`: cols holds the previous sample's im2col of the
// same geometry, whose all-padding rows need not be written again (a hint: some paths
// rewrite them anyway).
template <typename T>
void im2col(const T* x, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, const int64_t* p,
            int64_t oh, int64_t ow, T* cols, T* pad, bool zeros_kept = false) {
  (void)zeros_kept;  // only the AVX-512 f32 path uses the hint
  if (p[0] != 1 || p[1] != 1) return im2col_strided(x, c, h, w, kh, kw, p, oh, ow, cols);
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, float>)
    return im2col_unit_masked(x, c, h, w, kh, kw, p[2], p[3], oh, ow, cols, zeros_kept);
#endif
  const UnitGeom g{c, h + 2 * p[2], w + 2 * p[3], kh, kw, oh, ow};
  if (p[2] == 0 && p[3] == 0) return im2col_unit(x, g, cols);
  pad_planes(x, c, h, w, p[2], p[3], pad);
  im2col_unit(pad, g, cols);
}

// out[c][y][x] += cols[(c*kh + i)*kw + j][oy*ow + ox]: the adjoint of im2col.
template <typename T>
void col2im(const T* cols, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, const int64_t* p,
            int64_t oh, int64_t ow, T* x) {
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t i = 0; i < kh; ++i)
      for (int64_t j = 0; j < kw; ++j) {
        const T* row = cols + ((ci * kh + i) * kw + j) * oh * ow;
        int64_t lo, hi;
        valid_range(w, p[1], p[3], j, ow, &lo, &hi);
        for (int64_t oy = 0; oy < oh; ++oy) {
          const int64_t y = oy * p[0] - p[2] + i;
          if (y < 0 || y >= h) continue;
          const int64_t base = (ci * h + y) * w - p[3] + j;  // x[base + ox * sw] is column ox
          const T* in = row + oy * ow;
          if (p[1] == 1) for (int64_t ox = lo; ox < hi; ++ox) x[base + ox] += in[ox];
          else for (int64_t ox = lo; ox < hi; ++ox) x[base + ox * p[1]] += in[ox];
        }
      }
}


inline constexpr int64_t kCol2imMaxKw = 32;

#ifdef __AVX512F__
// col2im_unit_direct's f32 form (kw <= kCol2imMaxKw): the lane masks of each kernel column are worked out once per
// 16-column chunk instead of per output row.
inline void col2im_unit_masked(const float* cols, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw,
                               int64_t ph, int64_t pw, int64_t oh, int64_t ow, float* x) {
  __mmask16 masks[kCol2imMaxKw];
  for (int64_t x0 = 0; x0 < w; x0 += 16) {
    const int64_t n = std::min<int64_t>(16, w - x0);
    for (int64_t j = 0; j < kw; ++j) {
      // Lane l is column x0 + l, read from ox = x0 + l + pw - j when 0 <= ox < ow.
      const int64_t lo = std::max<int64_t>(0, j - pw - x0), hi = std::min<int64_t>(n, ow + j - pw - x0);
      masks[j] = lo < hi ? static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1)) : __mmask16{0};
    }
    const __mmask16 all = static_cast<__mmask16>((1u << n) - 1);
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t y = 0; y < h; ++y) {
        __m512 acc = _mm512_setzero_ps();
        const int64_t i_lo = std::max<int64_t>(0, y + ph - oh + 1), i_hi = std::min<int64_t>(kh, y + ph + 1);
        for (int64_t i = i_lo; i < i_hi; ++i) {
          // Masked-off lanes are never read, so the base may lie before the row.
          const float* src = cols + (ci * kh + i) * kw * oh * ow + (y + ph - i) * ow + x0 + pw;
          for (int64_t j = 0; j < kw; ++j)
            if (masks[j] != 0) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(masks[j], src + j * oh * ow - j));
        }
        _mm512_mask_storeu_ps(x + (ci * h + y) * w + x0, all, acc);
      }
  }
}
#endif

// col2im for unit stride, straight into x (no padded scratch, no zero fill): each output row
// sums its kh*kw contributions in registers and is stored once. The terms are added in the
// order (i, j) ascending from 0, as a zeroed accumulator in col2im would add them: the
// results are bit for bit those of the general col2im.
template <typename T>
void col2im_unit_direct(const T* cols, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw,
                        int64_t ph, int64_t pw, int64_t oh, int64_t ow, T* x) {
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, float>) {
    if (kw <= kCol2imMaxKw) return col2im_unit_masked(cols, c, h, w, kh, kw, ph, pw, oh, ow, x);
  }
#endif
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t y = 0; y < h; ++y) {
      T* xr = x + (ci * h + y) * w;
      for (int64_t xx = 0; xx < w; ++xx) {
        T acc = T(0);
        for (int64_t i = 0; i < kh; ++i) {
          const int64_t oy = y + ph - i;
          if (oy < 0 || oy >= oh) continue;
          for (int64_t j = 0; j < kw; ++j) {
            const int64_t ox = xx + pw - j;
            if (ox >= 0 && ox < ow) acc += cols[((ci * kh + i) * kw + j) * oh * ow + oy * ow + ox];
          }
        }
        xr[xx] = acc;
      }
    }
}

}  // namespace xs::detail
