// 2-D pooling (max, average) and its gradients over NCHW planes, with fast paths for unpadded
// windows and the usual 2x2 / stride 2 max pool (branch-free, so the loops vectorise). The
// max-pool gradient may take a per-channel bias: its pooled input was then relu(x + bias[c]);
// so may the max pool itself (it then returns relu(max + bias[c])).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "xla_spawn/base/check.h"
#include "xla_spawn/runtime/kernels/float_args.h"
#include "xla_spawn/runtime/kernels/kernels.h"
#include "xla_spawn/runtime/kernels/pool_simd.h"

namespace xs::detail {
namespace {

// Without padding every window lies inside the plane: no bounds checks (the common case).
template <typename T>
void pool_unpadded(bool is_max, const int64_t* p, const T* x, const Shape& xs, T* out,
                   const Shape& os) {
  const int64_t planes = xs[0] * xs[1], h = xs[2], w = xs[3], oh = os[2], ow = os[3];
  const T scale = T(1) / static_cast<T>(p[0] * p[1]);
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* xp = x + pl * h * w;
    T* op = out + pl * oh * ow;
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox) {
        const T* win = xp + oy * p[2] * w + ox * p[3];
        T acc = is_max ? win[0] : T(0);
        for (int64_t i = 0; i < p[0]; ++i)
          for (int64_t j = 0; j < p[1]; ++j) {
            const T v = win[i * w + j];
            acc = is_max ? (v > acc || std::isnan(v) ? v : acc) : acc + v;
          }
        op[oy * ow + ox] = is_max ? acc : acc * scale;
      }
  }
}

// 2x2 windows, stride 2, no padding (the usual max pool). First the elementwise max of the two
// rows (contiguous: vectorises), then of neighbouring pairs in that row (in L1).
template <typename T>
void max_pool_2x2(const T* x, int64_t planes, int64_t h, int64_t w, T* out, int64_t oh,
                  int64_t ow) {
  std::vector<T> rows(w);
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t oy = 0; oy < oh; ++oy) {
      const T* r0 = x + (pl * h + 2 * oy) * w;
      const T* r1 = r0 + w;
      for (int64_t i = 0; i < w; ++i) rows[i] = nan_max(r0[i], r1[i]);
      T* o = out + (pl * oh + oy) * ow;
      for (int64_t ox = 0; ox < ow; ++ox) o[ox] = nan_max(rows[2 * ox], rows[2 * ox + 1]);
    }
}

#ifdef __AVX512F__
// max_pool_2x2 on 16 windows at a time, bit for bit: the row pair's maximum, then of its
// even/odd columns (split by permutes).
void max_pool_2x2_avx512(const float* x, int64_t planes, int64_t h, int64_t w, float* out,
                         int64_t oh, int64_t ow) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t oy = 0; oy < oh; ++oy) {
      const float* r0 = x + (pl * h + 2 * oy) * w;
      const float* r1 = r0 + w;
      float* o = out + (pl * oh + oy) * ow;
      for (int64_t ox = 0; ox < ow; ox += 16) {
        const int64_t n = std::min<int64_t>(16, ow - ox);
        const __mmask16 m0 = first_bits(2 * n), m1 = first_bits(2 * n - 16);
        const __m512 lo = nan_max16(_mm512_maskz_loadu_ps(m0, r0 + 2 * ox),
                                    _mm512_maskz_loadu_ps(m0, r1 + 2 * ox));
        const __m512 hi = nan_max16(_mm512_maskz_loadu_ps(m1, r0 + 2 * ox + 16),
                                    _mm512_maskz_loadu_ps(m1, r1 + 2 * ox + 16));
        _mm512_mask_storeu_ps(
            o + ox, first_bits(n),
            nan_max16(_mm512_permutex2var_ps(lo, even, hi), _mm512_permutex2var_ps(lo, odd, hi)));
      }
    }
}
#endif

template <typename T>
void pool_typed(bool is_max, const int64_t* p, const T* x, const Shape& xs, T* out,
                const Shape& os) {
  if (is_max && p[0] == 2 && p[1] == 2 && p[2] == 2 && p[3] == 2 && p[4] == 0 && p[5] == 0) {
#ifdef __AVX512F__
    if constexpr (std::is_same_v<T, float>)
      return max_pool_2x2_avx512(x, xs[0] * xs[1], xs[2], xs[3], out, os[2], os[3]);
#endif
    return max_pool_2x2(x, xs[0] * xs[1], xs[2], xs[3], out, os[2], os[3]);
  }
  if (p[4] == 0 && p[5] == 0) return pool_unpadded(is_max, p, x, xs, out, os);
  const int64_t planes = xs[0] * xs[1], h = xs[2], w = xs[3], oh = os[2], ow = os[3];
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* xp = x + pl * h * w;
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox) {
        T acc = is_max ? -std::numeric_limits<T>::infinity() : T(0);
        for (int64_t i = 0; i < p[0]; ++i)
          for (int64_t j = 0; j < p[1]; ++j) {
            const int64_t y = oy * p[2] - p[4] + i, xx = ox * p[3] - p[5] + j;
            if (y < 0 || y >= h || xx < 0 || xx >= w) continue;  // padding: skipped (max) / 0 (avg)
            const T v = xp[y * w + xx];
            acc = is_max ? (v > acc || std::isnan(v) ? v : acc) : acc + v;
          }
        // avg: count_include_pad, as PyTorch's default.
        out[(pl * oh + oy) * ow + ox] = is_max ? acc : acc / static_cast<T>(p[0] * p[1]);
      }
  }
}

// Routes each window's gradient to its first maximum (max) or spreads it over the window
// divided by the full window size (avg, count_include_pad).
template <typename T>
void max_pool_grad_unpadded(const int64_t* p, const T* x, const T* g, const Shape& gs, T* out,
                            const Shape& os) {
  const int64_t planes = os[0] * os[1], h = os[2], w = os[3], oh = gs[2], ow = gs[3];
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* xp = x + pl * h * w;
    T* op = out + pl * h * w;
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox) {
        const int64_t at0 = oy * p[2] * w + ox * p[3];
        int64_t best = at0;
        T best_v = xp[at0];
        for (int64_t i = 0; i < p[0]; ++i)
          for (int64_t j = 0; j < p[1]; ++j) {
            const int64_t at = at0 + i * w + j;
            if (xp[at] > best_v || (std::isnan(xp[at]) && !std::isnan(best_v)))
              best = at, best_v = xp[at];
          }
        op[best] += g[(pl * oh + oy) * ow + ox];
      }
  }
}

// 2x2 windows, stride 2, no padding, even plane: the windows tile the plane, so every input
// cell is written once (the gradient at the window's first maximum, else 0) and no zero fill
// is needed.
template <bool kBiasRelu, typename T>
void max_pool_grad_2x2(const T* x, const T* g, const T* bias, int64_t channels, int64_t planes,
                       int64_t h, int64_t w, T* out) {
  const int64_t oh = h / 2, ow = w / 2;
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t oy = 0; oy < oh; ++oy) {
      const int64_t r0 = (pl * h + 2 * oy) * w, r1 = r0 + w;
      const T* gr = g + (pl * oh + oy) * ow;
      const T bv = kBiasRelu ? bias[pl % channels] : T(0);
      for (int64_t ox = 0; ox < ow; ++ox) {
        // Row-major first maximum: the winner of each row pair (ties: left), then the bottom
        // one only if it takes over the top one (ties: top). Selects only, no branches.
        const T a = pooled_input<kBiasRelu>(x[r0 + 2 * ox], bv),
                b = pooled_input<kBiasRelu>(x[r0 + 2 * ox + 1], bv),
                c = pooled_input<kBiasRelu>(x[r1 + 2 * ox], bv),
                d = pooled_input<kBiasRelu>(x[r1 + 2 * ox + 1], bv);
        const bool top_right = takes_over(a, b), bottom_right = takes_over(c, d);
        const T top = top_right ? b : a, bottom = bottom_right ? d : c;
        const bool down = takes_over(top, bottom);
        const T gv = gr[ox];
        out[r0 + 2 * ox] = !down & !top_right ? gv : T(0);
        out[r0 + 2 * ox + 1] = !down & top_right ? gv : T(0);
        out[r1 + 2 * ox] = down & !bottom_right ? gv : T(0);
        out[r1 + 2 * ox + 1] = down & bottom_right ? gv : T(0);
      }
    }
}

#ifdef __AVX512F__
// The same choices on 16 windows at once (AVX-512), bit for bit: masks for takes_over, the
// row pairs split into even/odd columns and interleaved back by permutes.
// n <= 16 windows of one row pair starting at column 0 of x0 / x1 (the rows) and gr.
template <bool kBiasRelu>
inline void max_pool_grad_2x2_x16(const float* x0, const float* x1, const float* gr, float* o0,
                                  float* o1, int64_t n, __m512 bias) {
  const Windows2x2x16 win = choose_2x2_x16<kBiasRelu>(x0, x1, n, bias);
  const __mmask16 down = win.down, top_right = win.top_right, bottom_right = win.bottom_right;
  const __m512 gv = _mm512_maskz_loadu_ps(win.valid, gr);
  store_windows16(o0, o1, n, _mm512_maskz_mov_ps(~down & ~top_right, gv),
                  _mm512_maskz_mov_ps(~down & top_right, gv),
                  _mm512_maskz_mov_ps(down & ~bottom_right, gv),
                  _mm512_maskz_mov_ps(down & bottom_right, gv));
}

template <bool kBiasRelu>
void max_pool_grad_2x2_avx512(const float* x, const float* g, const float* bias, int64_t channels,
                              int64_t planes, int64_t h, int64_t w, float* out) {
  const int64_t oh = h / 2, ow = w / 2;
  for (int64_t pl = 0; pl < planes; ++pl) {
    const __m512 bv = _mm512_set1_ps(kBiasRelu ? bias[pl % channels] : 0.0f);
    for (int64_t oy = 0; oy < oh; ++oy) {
      const int64_t r0 = (pl * h + 2 * oy) * w, r1 = r0 + w;
      const float* gr = g + (pl * oh + oy) * ow;
      for (int64_t ox = 0; ox < ow; ox += 16)
        max_pool_grad_2x2_x16<kBiasRelu>(x + r0 + 2 * ox, x + r1 + 2 * ox, gr + ox,
                                         out + r0 + 2 * ox, out + r1 + 2 * ox,
                                         std::min<int64_t>(16, ow - ox), bv);
    }
  }
}
#endif

// 2x2 / stride 2 windows of relu(y + bias[c]) over even planes: the window's maximum and the
// row-major position (0..3, as a float) of its first maximum, chosen exactly as
// max_pool_grad_2x2<true> chooses it, so routing by the stored position is that gradient.
template <typename T>
void argmax_2x2(const T* y, const T* bias, int64_t channels, int64_t h, int64_t w, T* val, T* idx) {
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, float>) {
    if (argmax_2x2_paired(y, bias, channels, h, w, val, idx)) return;
  }
#endif
  const int64_t oh = h / 2, ow = w / 2;
  for (int64_t pl = 0; pl < channels; ++pl)
    for (int64_t oy = 0; oy < oh; ++oy) {
      const T* r0 = y + (pl * h + 2 * oy) * w;
      const T* r1 = r0 + w;
      const int64_t at = (pl * oh + oy) * ow;
#ifdef __AVX512F__
      if constexpr (std::is_same_v<T, float>) {
        for (int64_t ox = 0; ox < ow; ox += 16)
          argmax_2x2_x16(r0 + 2 * ox, r1 + 2 * ox, std::min<int64_t>(16, ow - ox),
                         _mm512_set1_ps(bias[pl]), val + at + ox, idx + at + ox);
        continue;
      }
#endif
      for (int64_t ox = 0; ox < ow; ++ox) {
        const T a = pooled_input<true>(r0[2 * ox], bias[pl]),
                b = pooled_input<true>(r0[2 * ox + 1], bias[pl]),
                c = pooled_input<true>(r1[2 * ox], bias[pl]),
                d = pooled_input<true>(r1[2 * ox + 1], bias[pl]);
        const bool top_right = takes_over(a, b), bottom_right = takes_over(c, d);
        const T top = top_right ? b : a, bottom = bottom_right ? d : c;
        const bool down = takes_over(top, bottom);
        val[at + ox] = down ? bottom : top;
        idx[at + ox] = static_cast<T>((down ? 2 : 0) + ((down ? bottom_right : top_right) ? 1 : 0));
      }
    }
}

// The adjoint: out[channels][h][w] gets g at each window's stored position, 0 elsewhere.
template <typename T>
void route_2x2(const T* idx, const T* g, int64_t channels, int64_t h, int64_t w, T* out) {
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, float>) {
    if (route_2x2_flat(idx, g, channels, h, w, out)) return;
  }
#endif
  const int64_t oh = h / 2, ow = w / 2;
  for (int64_t pl = 0; pl < channels; ++pl)
    for (int64_t oy = 0; oy < oh; ++oy) {
      T* o0 = out + (pl * h + 2 * oy) * w;
      T* o1 = o0 + w;
      const int64_t at = (pl * oh + oy) * ow;
#ifdef __AVX512F__
      if constexpr (std::is_same_v<T, float>) {
        for (int64_t ox = 0; ox < ow; ox += 16)
          route_2x2_x16(idx + at + ox, g + at + ox, std::min<int64_t>(16, ow - ox), o0 + 2 * ox,
                        o1 + 2 * ox);
        continue;
      }
#endif
      for (int64_t ox = 0; ox < ow; ++ox) {
        const T k = idx[at + ox], gv = g[at + ox];
        o0[2 * ox] = k == T(0) ? gv : T(0);
        o0[2 * ox + 1] = k == T(1) ? gv : T(0);
        o1[2 * ox] = k == T(2) ? gv : T(0);
        o1[2 * ox + 1] = k == T(3) ? gv : T(0);
      }
    }
}

template <typename T>
void pool_grad_typed(bool is_max, const int64_t* p, const T* x, const T* g, const Shape& gs, T* out,
                     const Shape& os, const T* bias = nullptr) {
  const int64_t planes = os[0] * os[1], h = os[2], w = os[3], oh = gs[2], ow = gs[3];
  if (is_max && p[0] == 2 && p[1] == 2 && p[2] == 2 && p[3] == 2 && p[4] == 0 && p[5] == 0 &&
      h % 2 == 0 && w % 2 == 0) {
#ifdef __AVX512F__
    if constexpr (std::is_same_v<T, float>) {
      if (bias) return max_pool_grad_2x2_avx512<true>(x, g, bias, os[1], planes, h, w, out);
      return max_pool_grad_2x2_avx512<false>(x, g, bias, os[1], planes, h, w, out);
    }
#endif
    if (bias) return max_pool_grad_2x2<true>(x, g, bias, os[1], planes, h, w, out);
    return max_pool_grad_2x2<false>(x, g, bias, os[1], planes, h, w, out);
  }
  if (bias) {
    // Other windows: materialise the pooled input once (rare; the fused form targets 2x2).
    std::vector<T> y(numel(os));
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t i = 0; i < h * w; ++i)
        y[pl * h * w + i] = pooled_input<true>(x[pl * h * w + i], bias[pl % os[1]]);
    return pool_grad_typed(is_max, p, y.data(), g, gs, out, os);
  }
  std::fill(out, out + numel(os), T(0));
  if (is_max && p[4] == 0 && p[5] == 0) return max_pool_grad_unpadded(p, x, g, gs, out, os);
  for (int64_t pl = 0; pl < planes; ++pl) {
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox) {
        const T gv = g[(pl * oh + oy) * ow + ox];
        int64_t best = -1;
        T best_v = -std::numeric_limits<T>::infinity();
        for (int64_t i = 0; i < p[0]; ++i)
          for (int64_t j = 0; j < p[1]; ++j) {
            const int64_t y = oy * p[2] - p[4] + i, xx = ox * p[3] - p[5] + j;
            if (y < 0 || y >= h || xx < 0 || xx >= w) continue;
            const int64_t at = (pl * h + y) * w + xx;
            if (!is_max)
              out[at] += gv / static_cast<T>(p[0] * p[1]);
            else if (best < 0 || x[at] > best_v || (std::isnan(x[at]) && !std::isnan(best_v)))
              best = at, best_v = x[at];
          }
        if (is_max && best >= 0) out[best] += gv;
      }
  }
}

}  // namespace

template <typename T>
void max_pool2d_grad_planes(const int64_t* pool, const T* y, const T* g, const T* bias,
                            int64_t channels, int64_t h, int64_t w, T* out) {
  const Shape os{1, channels, h, w};
  const Shape gs{1, channels, (h + 2 * pool[4] - pool[0]) / pool[2] + 1,
                 (w + 2 * pool[5] - pool[1]) / pool[3] + 1};
  pool_grad_typed(true, pool, y, g, gs, out, os, bias);
}

template <typename T>
void max_pool2d_argmax_planes(const T* y, const T* bias, int64_t channels, int64_t h, int64_t w,
                              T* val, T* idx) {
  argmax_2x2(y, bias, channels, h, w, val, idx);
}

template <typename T>
void max_pool2d_route_planes(const T* idx, const T* g, int64_t channels, int64_t h, int64_t w,
                             T* out) {
  route_2x2(idx, g, channels, h, w, out);
}

template void max_pool2d_argmax_planes<float>(const float*, const float*, int64_t, int64_t, int64_t,
                                              float*, float*);
template void max_pool2d_argmax_planes<double>(const double*, const double*, int64_t, int64_t,
                                               int64_t, double*, double*);
template void max_pool2d_route_planes<float>(const float*, const float*, int64_t, int64_t, int64_t,
                                             float*);
template void max_pool2d_route_planes<double>(const double*, const double*, int64_t, int64_t,
                                              int64_t, double*);
template void max_pool2d_grad_planes<float>(const int64_t*, const float*, const float*,
                                            const float*, int64_t, int64_t, int64_t, float*);
template void max_pool2d_grad_planes<double>(const int64_t*, const double*, const double*,
                                             const double*, int64_t, int64_t, int64_t, double*);

namespace {

// max_pool2d(x, bias): out = relu(max_pool2d(x) + bias[c]), one sample at a time so the
// bias-and-ReLU pass reads the pooled sample while it is still in L1 (the compiler's
// bias-relu-pool fusion; the same adds and selects as the loop it replaces).
template <typename T>
void max_pool_bias_relu(const int64_t* p, const T* x, const Shape& xs, const T* bias, T* out,
                        const Shape& os) {
  const int64_t c = xs[1], in_sample = c * xs[2] * xs[3], plane = os[2] * os[3];
  const Shape one_in{1, c, xs[2], xs[3]}, one_out{1, c, os[2], os[3]};
  for (int64_t b = 0; b < xs[0]; ++b) {
    T* o = out + b * c * plane;
    pool_typed(true, p, x + b * in_sample, one_in, o, one_out);
    for (int64_t ci = 0; ci < c; ++ci) {
      const T bv = bias[ci];
      for (int64_t i = 0; i < plane; ++i) {
        const T v = o[ci * plane + i] + bv;
        o[ci * plane + i] = v > 0 ? v : T(0);
      }
    }
  }
}

}  // namespace

void pool2d_kernel(Op op, const Attrs& attrs, std::span<const Arg> ins, const Arg& out) {
  const bool is_max = op == Op::kMaxPool2d;
  const int64_t* p = attrs.ints.data();
  const Arg& x = ins[0];
  const Shape &xs = x.type->shape, &os = out.type->shape;
  if (ins.size() == 2) {
    XS_CHECK(is_max, "only max_pool2d takes a bias");
    return with_float(out.type->dtype, ins, out, [&](const auto& in, auto* o) {
      max_pool_bias_relu(p, in[0], xs, in[1], o, os);
    });
  }
  switch (out.type->dtype) {
    case DType::kF32:
      return pool_typed(is_max, p, static_cast<const float*>(x.data), xs,
                        static_cast<float*>(out.data), os);
    case DType::kF64:
      return pool_typed(is_max, p, static_cast<const double*>(x.data), xs,
                        static_cast<double*>(out.data), os);
    case DType::kBF16: {
      const float* xf = to_float(x.data, numel(xs), 0);
      float* of = f32_scratch(1, numel(os));  // every window's output written
      pool_typed(is_max, p, xf, xs, of, os);
      return from_float(of, numel(os), out.data);
    }
    default:
      XS_CHECK(false, "pool2d on {} is rejected by the shape rule", dtype_name(out.type->dtype));
  }
}

void pool2d_grad_kernel(Op op, const Attrs& attrs, std::span<const Arg> ins, const Arg& out) {
  const bool is_max = op == Op::kMaxPool2dGrad;
  const Arg& g = ins[is_max ? 1 : 0];
  with_float(out.type->dtype, ins, out, [&](const auto& in, auto* o) {
    pool_grad_typed(is_max, attrs.ints.data(), is_max ? in[0] : nullptr, in[is_max ? 1 : 0],
                    g.type->shape, o, out.type->shape, is_max && in.size() == 3 ? in[2] : nullptr);
  }, /*writes_all=*/true);  // pool_grad_typed fills every cell (2x2 windows) or zeroes first
}

}  // namespace xs::detail
