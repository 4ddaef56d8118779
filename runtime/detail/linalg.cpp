// Matmul (batched, with transpose flags; accumulating form with beta) and conv2d (im2col +
// GEMM) with its gradients. f32/f64 GEMMs call OpenBLAS directly; other dtypes go through
// Eigen. Pooling is in pool.cpp.
#define EIGEN_USE_BLAS
#include <Eigen/Core>

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <spdlog/spdlog.h>

#include "base/check.h"
#include "runtime/detail/float_args.h"
#include "runtime/detail/kernels.h"

namespace xs::detail {
namespace {

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c) {
  if (m == 0 || n == 0) return;
  Eigen::Map<RowMat<T>> cm(c, m, n);
  if (k == 0) {
    cm.setZero();
    return;
  }
  // f32/f64 straight to OpenBLAS with beta = 0: Eigen's BLAS path zeroes C and then calls
  // gemm with beta = 1, an extra write and read of the whole output.
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    const auto to = [](bool t) { return t ? CblasTrans : CblasNoTrans; };
    const blasint bm = static_cast<blasint>(m), bn = static_cast<blasint>(n), bk = static_cast<blasint>(k);
    const blasint lda = ta ? bm : bk, ldb = tb ? bk : bn;
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, to(ta), to(tb), bm, bn, bk, 1.0f, a, lda, b, ldb, 0.0f, c, bn);
    } else {
      cblas_dgemm(CblasRowMajor, to(ta), to(tb), bm, bn, bk, 1.0, a, lda, b, ldb, 0.0, c, bn);
    }
    return;
  }
  Eigen::Map<const RowMat<T>> am(a, ta ? k : m, ta ? m : k);
  Eigen::Map<const RowMat<T>> bm(b, tb ? n : k, tb ? k : n);
  if (!ta && !tb) cm.noalias() = am * bm;
  else if (ta && !tb) cm.noalias() = am.transpose() * bm;
  else if (!ta && tb) cm.noalias() = am * bm.transpose();
  else cm.noalias() = am.transpose() * bm.transpose();
}


template <typename T>
void batched(const Attrs& attrs, const T* a, const Shape& as, const T* b, const Shape& bs, T* c,
             const Shape& cs) {
  const bool ta = attrs.flag & 1, tb = attrs.flag & 2;
  const size_t r = cs.size();
  const int64_t m = cs[r - 2], n = cs[r - 1], k = as[as.size() - (ta ? 2 : 1)];
  const Shape batch(cs.begin(), cs.end() - 2);
  const std::vector<int64_t> sa = broadcast_strides(Shape(as.begin(), as.end() - 2), batch);
  const std::vector<int64_t> sb = broadcast_strides(Shape(bs.begin(), bs.end() - 2), batch);
  const int64_t nb = numel(batch);
  std::vector<int64_t> coord(batch.size(), 0);
  for (int64_t i = 0; i < nb; ++i) {
    int64_t oa = 0, ob = 0;
    for (size_t d = 0; d < batch.size(); ++d) oa += coord[d] * sa[d], ob += coord[d] * sb[d];
    gemm<T>(ta, tb, m, n, k, a + oa * m * k, b + ob * k * n, c + i * m * n);
    for (int64_t d = static_cast<int64_t>(batch.size()) - 1; d >= 0; --d) {
      if (++coord[d] < batch[d]) break;
      coord[d] = 0;
    }
  }
}

}  // namespace

void init_blas_threads() {
  openblas_set_num_threads(1);
  // Under a hypervisor OpenBLAS may not recognise the CPU and fall back to its SSE3
  // (Prescott) kernels: about 4x slower GEMM on an AVX-512 machine (see bench/runtime). The
  // choice is made when the library loads, so only the environment can fix it: say how, once.
  static const bool warned = [] {
    const std::string core = openblas_get_corename();
    if (__builtin_cpu_supports("avx2") && (core == "Prescott" || core == "Core2" || core == "Nehalem")) {
      spdlog::warn("OpenBLAS chose its {} kernels on a CPU with {}: set OPENBLAS_CORETYPE={} before "
                   "starting for a several-fold faster GEMM",
                   core, __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2",
                   __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell");
    }
    return true;
  }();
  (void)warned;
}

void gemm_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b,
              float* c) {
  gemm<float>(ta, tb, m, n, k, a, b, c);
}

void matmul_kernel(const Attrs& attrs, const Arg& a, const Arg& b, const Arg& out) {
  const Shape &as = a.type->shape, &bs = b.type->shape, &cs = out.type->shape;
  switch (out.type->dtype) {
    case DType::kF32:
      return batched(attrs, static_cast<const float*>(a.data), as, static_cast<const float*>(b.data), bs,
                     static_cast<float*>(out.data), cs);
    case DType::kF64:
      return batched(attrs, static_cast<const double*>(a.data), as, static_cast<const double*>(b.data),
                     bs, static_cast<double*>(out.data), cs);
    case DType::kI32:
      return batched(attrs, static_cast<const int32_t*>(a.data), as, static_cast<const int32_t*>(b.data),
                     bs, static_cast<int32_t*>(out.data), cs);
    case DType::kI64:
      return batched(attrs, static_cast<const int64_t*>(a.data), as, static_cast<const int64_t*>(b.data),
                     bs, static_cast<int64_t*>(out.data), cs);
    case DType::kBF16: {
      const std::vector<float> af = to_float(a.data, numel(as)), bf = to_float(b.data, numel(bs));
      std::vector<float> cf(numel(cs));
      batched(attrs, af.data(), as, bf.data(), bs, cf.data(), cs);
      return from_float(cf, out.data);
    }
    case DType::kBool: XS_CHECK(false, "matmul on bool is rejected by the shape rule");
  }
}

void matmul_accumulate_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out) {
  const bool ta = attrs.flag & 1, tb = attrs.flag & 2;
  const Shape& as = ins[0].type->shape;
  const Shape& cs = out.type->shape;
  const blasint m = static_cast<blasint>(cs[0]), n = static_cast<blasint>(cs[1]);
  const blasint k = static_cast<blasint>(as[ta ? 0 : 1]);
  const size_t bytes = static_cast<size_t>(m) * n * dtype_size(out.type->dtype);
  if (ins[2].data != out.data && bytes > 0) std::memcpy(out.data, ins[2].data, bytes);
  if (m == 0 || n == 0) return;
  const auto to = [](bool t) { return t ? CblasTrans : CblasNoTrans; };
  const blasint lda = ta ? m : k, ldb = tb ? k : n;
  if (out.type->dtype == DType::kF32) {
    const float beta = *static_cast<const float*>(ins[3].data);
    cblas_sgemm(CblasRowMajor, to(ta), to(tb), m, n, k, 1.0f, static_cast<const float*>(ins[0].data), lda,
                static_cast<const float*>(ins[1].data), ldb, beta, static_cast<float*>(out.data), n);
  } else {
    XS_CHECK(out.type->dtype == DType::kF64, "accumulating matmul on {}", dtype_name(out.type->dtype));
    const double beta = *static_cast<const double*>(ins[3].data);
    cblas_dgemm(CblasRowMajor, to(ta), to(tb), m, n, k, 1.0, static_cast<const double*>(ins[0].data), lda,
                static_cast<const double*>(ins[1].data), ldb, beta, static_cast<double*>(out.data), n);
  }
}

namespace {

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

// Moves and adds of one short run (a row of a 14x14 or 28x28 map): with AVX-512, one masked
// instruction per 16 floats and no scalar tail; otherwise copy_short / a plain loop.
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

template <typename T>
inline void add_run(const T* in, int64_t n, T* out) {
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, float>) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(out + i), _mm512_loadu_ps(in + i)));
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      _mm512_mask_storeu_ps(
          out + i, m,
          _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + i), _mm512_maskz_loadu_ps(m, in + i)));
    }
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) out[i] += in[i];
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

// The adjoint: pad[c][oy + i][ox + j] += cols[...], pad zeroed first.
template <typename T>
void col2im_unit(const T* cols, const UnitGeom& g, T* pad) {
  std::fill(pad, pad + g.c * g.hp * g.wp, T(0));
  for (int64_t ci = 0; ci < g.c; ++ci)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const T* row = cols + ((ci * g.kh + i) * g.kw + j) * g.oh * g.ow;
        T* dst = pad + (ci * g.hp + i) * g.wp + j;
        for (int64_t oy = 0; oy < g.oh; ++oy) add_run(row + oy * g.ow, g.ow, dst + oy * g.wp);
      }
}

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

// im2col of one sample; `pad` is scratch for the padded planes (unit stride).
template <typename T>
void im2col(const T* x, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, const int64_t* p,
            int64_t oh, int64_t ow, T* cols, std::vector<T>& pad) {
  if (p[0] != 1 || p[1] != 1) return im2col_strided(x, c, h, w, kh, kw, p, oh, ow, cols);
  const UnitGeom g{c, h + 2 * p[2], w + 2 * p[3], kh, kw, oh, ow};
  if (p[2] == 0 && p[3] == 0) return im2col_unit(x, g, cols);
  pad.resize(c * g.hp * g.wp);
  pad_planes(x, c, h, w, p[2], p[3], pad.data());
  im2col_unit(pad.data(), g, cols);
}

template <typename T>
void conv2d_typed(const int64_t* p, const T* x, const Shape& xs, const T* wt, const Shape& ws, T* out,
                  const Shape& os) {
  const int64_t n = xs[0], c = xs[1], h = xs[2], w = xs[3], o = ws[0], kh = ws[2], kw = ws[3];
  const int64_t oh = os[2], ow = os[3], ckk = c * kh * kw;
  std::vector<T> cols(ckk * oh * ow), pad;
  for (int64_t b = 0; b < n; ++b) {
    im2col(x + b * c * h * w, c, h, w, kh, kw, p, oh, ow, cols.data(), pad);
    gemm<T>(false, false, o, oh * ow, ckk, wt, cols.data(), out + b * o * oh * ow);
  }
}


}  // namespace

void conv2d_kernel(const Attrs& attrs, const Arg& x, const Arg& w, const Arg& out) {
  const int64_t* p = attrs.ints.data();
  const Shape &xs = x.type->shape, &ws = w.type->shape, &os = out.type->shape;
  switch (out.type->dtype) {
    case DType::kF32:
      return conv2d_typed(p, static_cast<const float*>(x.data), xs, static_cast<const float*>(w.data), ws,
                          static_cast<float*>(out.data), os);
    case DType::kF64:
      return conv2d_typed(p, static_cast<const double*>(x.data), xs, static_cast<const double*>(w.data),
                          ws, static_cast<double*>(out.data), os);
    case DType::kBF16: {
      const std::vector<float> xf = to_float(x.data, numel(xs)), wf = to_float(w.data, numel(ws));
      std::vector<float> of(numel(os));
      conv2d_typed(p, xf.data(), xs, wf.data(), ws, of.data(), os);
      return from_float(of, out.data);
    }
    default: XS_CHECK(false, "conv2d on {} is rejected by the shape rule", dtype_name(out.type->dtype));
  }
}


}  // namespace xs::detail

// Gradients of conv2d and pooling: the adjoints of the forward kernels above.
namespace xs::detail {
namespace {

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

template <typename T>
void conv_grad_input_typed(const int64_t* p, const T* g, const Shape& gs, const T* wt, const Shape& ws, T* out,
                           const Shape& os) {
  const int64_t n = gs[0], o = gs[1], oh = gs[2], ow = gs[3], c = ws[1], kh = ws[2], kw = ws[3];
  const int64_t h = os[2], w = os[3], ckk = c * kh * kw;
  std::vector<T> cols(ckk * oh * ow);
  if (p[0] == 1 && p[1] == 1) {
    // Accumulate into a zeroed padded scratch (no bounds cases), then copy its interior out:
    // `out` is written once, never zero-filled and re-read.
    const UnitGeom geom{c, h + 2 * p[2], w + 2 * p[3], kh, kw, oh, ow};
    std::vector<T> pad(c * geom.hp * geom.wp);
    for (int64_t b = 0; b < n; ++b) {
      gemm<T>(true, false, ckk, oh * ow, o, wt, g + b * o * oh * ow, cols.data());
      col2im_unit(cols.data(), geom, pad.data());
      for (int64_t ci = 0; ci < c; ++ci)
        for (int64_t y = 0; y < h; ++y)
          copy_run(pad.data() + (ci * geom.hp + y + p[2]) * geom.wp + p[3], w,
                   out + ((b * c + ci) * h + y) * w);
    }
    return;
  }
  std::fill(out, out + numel(os), T(0));
  for (int64_t b = 0; b < n; ++b) {
    gemm<T>(true, false, ckk, oh * ow, o, wt, g + b * o * oh * ow, cols.data());
    col2im(cols.data(), c, h, w, kh, kw, p, oh, ow, out + b * c * h * w);
  }
}

template <typename T>
void conv_grad_weight_typed(const int64_t* p, const T* x, const Shape& xs, const T* g, const Shape& gs, T* out,
                            const Shape& os) {
  const int64_t n = xs[0], c = xs[1], h = xs[2], w = xs[3], o = gs[1], oh = gs[2], ow = gs[3];
  const int64_t kh = os[2], kw = os[3], ckk = c * kh * kw;
  std::fill(out, out + numel(os), T(0));
  std::vector<T> cols(ckk * oh * ow), pad;
  if constexpr (std::is_same_v<T, float>) {
    // Accumulate over the batch inside the GEMM (beta = 1): no per-sample partial to add.
    const blasint m = static_cast<blasint>(o), nn = static_cast<blasint>(ckk), k = static_cast<blasint>(oh * ow);
    for (int64_t b = 0; b < n; ++b) {
      im2col(x + b * c * h * w, c, h, w, kh, kw, p, oh, ow, cols.data(), pad);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nn, k, 1.0f, g + b * o * oh * ow, k, cols.data(), k,
                  b == 0 ? 0.0f : 1.0f, out, nn);
    }
    return;
  }
  std::vector<T> part(o * ckk);
  for (int64_t b = 0; b < n; ++b) {
    im2col(x + b * c * h * w, c, h, w, kh, kw, p, oh, ow, cols.data(), pad);
    gemm<T>(false, true, o, ckk, oh * ow, g + b * o * oh * ow, cols.data(), part.data());
    for (int64_t i = 0; i < o * ckk; ++i) out[i] += part[i];
  }
}



}  // namespace

void conv2d_grad_input_kernel(const Attrs& attrs, const Arg& g, const Arg& w, const Arg& out) {
  const Arg ins[] = {g, w};
  with_float(out.type->dtype, ins, out, [&](const auto& in, auto* o) {
    conv_grad_input_typed(attrs.ints.data(), in[0], g.type->shape, in[1], w.type->shape, o, out.type->shape);
  });
}

void conv2d_grad_weight_kernel(const Attrs& attrs, const Arg& x, const Arg& g, const Arg& out) {
  const Arg ins[] = {x, g};
  with_float(out.type->dtype, ins, out, [&](const auto& in, auto* o) {
    conv_grad_weight_typed(attrs.ints.data(), in[0], x.type->shape, in[1], g.type->shape, o, out.type->shape);
  });
}


}  // namespace xs::detail
