// Matmul (batched, with transpose flags; accumulating form with beta) and conv2d (im2col +
// GEMM) with its gradients. f32/f64 GEMMs call OpenBLAS directly, except large f32 products
// with beta = 0, which go to oneDNN (use_onednn); integer products are a plain loop. bf16
// matmul and convolution run on oneDNN's bf16 primitives where use_onednn_bf16 says so
// (prepare_op_kernel, onednn.h), else widened to f32 here. im2col/col2im are in im2col.h,
// pooling in pool.cpp.
#include <cblas.h>
#include <dnnl.h>
#include <omp.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <spdlog/spdlog.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/kernels/conv_rows.h"
#include "xla_spawn/runtime/kernels/float_args.h"
#include "xla_spawn/runtime/kernels/im2col.h"
#include "xla_spawn/runtime/kernels/kernels.h"
#include "xla_spawn/runtime/kernels/onednn.h"

namespace xs::detail {
namespace {

// Large f32 products (beta = 0) go to oneDNN's sgemm: on one thread it ran the GPT's linear
// layers ([4096, 128] x [128, 128 or 512] and their gradients) 15-19% faster than OpenBLAS's
// SkylakeX kernels with operands out of cache, as in a training step; OpenBLAS stays faster on
// small products (the attention's 128 x 128 x 32), hence the threshold.
// XLA_SPAWN_GEMM=openblas keeps every product on OpenBLAS, for comparison.
constexpr int64_t kOnednnMinWork = int64_t{1} << 22;  // m n k: 4 Mi multiply-adds

// XLA_SPAWN_GEMM: auto (oneDNN for large products and for causal ones, kernels.h) or
// openblas (every f32 product on the BLAS).
bool onednn_gemm_enabled() {
  static const bool enabled = [] {
    const std::optional<std::string> v = env_string("XLA_SPAWN_GEMM");
    if (!v || *v == "auto") return true;
    if (*v == "openblas") return false;
    throw InvalidArgument(fmt::format("XLA_SPAWN_GEMM={}: expected auto or openblas", *v));
  }();
  return enabled;
}

bool use_onednn(int64_t m, int64_t n, int64_t k) {
  return onednn_gemm_enabled() && m * n * k >= kOnednnMinWork;
}

void onednn_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float* c) {
  // oneDNN's CPU runtime is OpenMP; one thread per replica, whatever thread calls.
  omp_set_num_threads(1);
  const dnnl_status_t status = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
  if (status != dnnl_success) {
    throw InternalError(fmt::format("dnnl_sgemm {}x{}x{} (ta {}, tb {}) failed with status {}", m, n, k, ta, tb,
                                    static_cast<int>(status)));
  }
}

// Integer products (index arithmetic, never a model's hot path): a plain loop that wraps on
// overflow as two's complement does, the sum taken in the unsigned type so wrapping is defined.
template <typename T>
void gemm_integer(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c) {
  using U = std::make_unsigned_t<T>;
  std::vector<U> row(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    std::fill(row.begin(), row.end(), U{0});
    for (int64_t p = 0; p < k; ++p) {
      const U x = static_cast<U>(ta ? a[p * m + i] : a[i * k + p]);
      for (int64_t j = 0; j < n; ++j) row[j] += x * static_cast<U>(tb ? b[j * k + p] : b[p * n + j]);
    }
    for (int64_t j = 0; j < n; ++j) c[i * n + j] = static_cast<T>(row[j]);
  }
}

template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_integral_v<T>) {
    return gemm_integer(ta, tb, m, n, k, a, b, c);
  } else {
    if (k == 0) {
      std::fill(c, c + m * n, T{0});
      return;
    }
    // f32/f64 straight to the BLAS with beta = 0.
    const auto to = [](bool t) { return t ? CblasTrans : CblasNoTrans; };
    const blasint bm = static_cast<blasint>(m), bn = static_cast<blasint>(n),
                  bk = static_cast<blasint>(k);
    const blasint lda = ta ? bm : bk, ldb = tb ? bk : bn;
    if constexpr (std::is_same_v<T, float>) {
      if (use_onednn(m, n, k)) return onednn_sgemm(ta, tb, m, n, k, a, lda, b, ldb, c);
      cblas_sgemm(CblasRowMajor, to(ta), to(tb), bm, bn, bk, 1.0f, a, lda, b, ldb, 0.0f, c, bn);
    } else {
      static_assert(std::is_same_v<T, double>);
      cblas_dgemm(CblasRowMajor, to(ta), to(tb), bm, bn, bk, 1.0, a, lda, b, ldb, 0.0, c, bn);
    }
  }
}

// c[m x n] (leading dimension ldc) = op(a) op(b), f32/f64 on the BLAS, k >= 1.
template <typename T>
void gemm_ld(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
             int64_t ldb, T* c, int64_t ldc) {
  const auto to = [](bool t) { return t ? CblasTrans : CblasNoTrans; };
  const auto bi = [](int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, to(ta), to(tb), bi(m), bi(n), bi(k), 1.0f, a, bi(lda), b, bi(ldb), 0.0f, c, bi(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, to(ta), to(tb), bi(m), bi(n), bi(k), 1.0, a, bi(lda), b, bi(ldb), 0.0, c, bi(ldc));
  }
}

// One T x T causal product (kernels.h, kMatmulCausalOut...) by row blocks [r0, r1). a is
// stored [t, k] ([k, t] when ta), b [k, n] ([n, k] when tb), c [t, n].
template <typename T>
void causal_gemm(int64_t structure, bool ta, bool tb, int64_t t, int64_t n, int64_t k, const T* a,
                 const T* b, T* c) {
  const int64_t lda = ta ? t : k, ldb = tb ? k : n;
  // Element (row i, inner p) of a as multiplied, and (inner p, column j) of b.
  const auto a_at = [&](int64_t i, int64_t p) { return ta ? a + p * t + i : a + i * k + p; };
  const auto b_at = [&](int64_t p, int64_t j) { return tb ? b + j * k + p : b + p * n + j; };
  for (int64_t r0 = 0; r0 < t; r0 += kCausalBlock) {
    const CausalBlock blk = causal_block(structure, r0, t, k, n);
    T* c_rows = c + r0 * n;
    gemm_ld(ta, tb, blk.rows, blk.cols, blk.p1 - blk.p0, a_at(r0, blk.p0), lda, b_at(blk.p0, 0), ldb, c_rows, n);
    for (int64_t i = 0; i < blk.rows; ++i) std::fill(c_rows + i * n + blk.cols, c_rows + (i + 1) * n, T{0});
  }
}

template <typename T>
void batched(const Attrs& attrs, const T* a, const Shape& as, const T* b, const Shape& bs, T* c,
             const Shape& cs) {
  const bool ta = attrs.flag & 1, tb = attrs.flag & 2;
  const size_t r = cs.size();
  const int64_t m = cs[r - 2], n = cs[r - 1], k = as[as.size() - (ta ? 2 : 1)];
  int64_t structure = 0;
  if constexpr (std::is_floating_point_v<T>) {
    structure = attrs.flag & (kMatmulCausalOut | kMatmulLowerA | kMatmulUpperA);
    const bool square = structure == kMatmulCausalOut ? m == n : m == k;
    XS_CHECK((structure & (structure - 1)) == 0, "matmul: more than one causal structure bit in flag {}",
             attrs.flag);
    XS_CHECK(structure == 0 || square, "matmul: causal structure {} on a {}x{}x{} product", structure, m, n, k);
    if (m == 0 || n == 0 || k == 0) structure = 0;  // nothing to skip: gemm's empty cases
  }
  const Shape batch(cs.begin(), cs.end() - 2);
  const std::vector<int64_t> sa = broadcast_strides(Shape(as.begin(), as.end() - 2), batch);
  const std::vector<int64_t> sb = broadcast_strides(Shape(bs.begin(), bs.end() - 2), batch);
  const int64_t nb = numel(batch);
  std::vector<int64_t> coord(batch.size(), 0);
  for (int64_t i = 0; i < nb; ++i) {
    int64_t oa = 0, ob = 0;
    for (size_t d = 0; d < batch.size(); ++d) oa += coord[d] * sa[d], ob += coord[d] * sb[d];
    const T *ai = a + oa * m * k, *bi = b + ob * k * n;
    T* ci = c + i * m * n;
    if constexpr (std::is_floating_point_v<T>) {
      if (structure != 0) causal_gemm<T>(structure, ta, tb, m, n, k, ai, bi, ci);
      else gemm<T>(ta, tb, m, n, k, ai, bi, ci);
    } else {
      gemm<T>(ta, tb, m, n, k, ai, bi, ci);  // integer products carry no structure
    }
    for (int64_t d = static_cast<int64_t>(batch.size()) - 1; d >= 0; --d) {
      if (++coord[d] < batch[d]) break;
      coord[d] = 0;
    }
  }
}

}  // namespace

void init_blas_threads() {
  openblas_set_num_threads(1);
  // Reads XLA_SPAWN_GEMM, XLA_SPAWN_BF16_ENGINE and XLA_SPAWN_CONV now: a bad value fails the
  // runtime's start, not a step.
  use_onednn(0, 0, 0);
  use_onednn_bf16();
  onednn_runs_f32_conv(0);
  // Under a hypervisor OpenBLAS may not recognise the CPU and fall back to its SSE3
  // (Prescott) kernels: about 4x slower GEMM on an AVX-512 machine (see bench/runtime). The
  // choice is made when the library loads, so only the environment can fix it: say how, once.
  static const bool warned = [] {
    const std::string core = openblas_get_corename();
    if (__builtin_cpu_supports("avx2") &&
        (core == "Prescott" || core == "Core2" || core == "Nehalem")) {
      spdlog::warn(
          "OpenBLAS chose its {} kernels on a CPU with {}: set OPENBLAS_CORETYPE={} before "
          "starting for a several-fold faster GEMM",
          core, __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2",
          __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell");
    }
    return true;
  }();
  (void)warned;
}

constexpr int64_t kOnednnGradInputMinChannels = 8;

// f32 convolutions from 16 input channels go to oneDNN's f32 primitive (its blocked layouts):
// 1.2-1.8x the runtime's unfused kernels at the CNN's conv2 and at 16 channels, forward and
// both gradients, but its input gradient lost below 16 channels (0.1-0.6x) and its forward at
// 1 channel (0.6x) (bench/runtime/bf16_gemm_bench). Unfused on oneDNN, conv2 made the CNN's
// f32 step about 16% faster than fused on the runtime's kernels (train_bench --filter cnn).
constexpr int64_t kOnednnF32ConvMinChannels = 16;

bool onednn_runs_f32_conv(int64_t in_channels) {
  const std::optional<std::string> v = env_string("XLA_SPAWN_CONV");
  if (v && *v != "auto" && *v != "runtime")
    throw InvalidArgument(fmt::format("XLA_SPAWN_CONV={}: expected auto or runtime", *v));
  return (!v || *v == "auto") && in_channels >= kOnednnF32ConvMinChannels;
}

std::shared_ptr<const PreparedKernel> prepare_op_kernel(Op op, const Attrs& attrs,
                                                        std::span<const ValueType> ins,
                                                        const ValueType& out) {
  const bool conv = op == Op::kConv2d || op == Op::kConv2dGradInput || op == Op::kConv2dGradWeight;
  // Every form's result has the input channels at axis 1: x [n, c, h, w], dw [o, c, kh, kw]; the
  // forward's x is its first operand.
  if (out.dtype == DType::kF32 && conv && ins.size() == 2 &&
      onednn_runs_f32_conv(op == Op::kConv2d ? ins[0].shape[1] : out.shape[1]))
    return make_onednn_conv(op, attrs, ins, out, ConvLayout::kChosen);
  if (op == Op::kMatmul && out.dtype == DType::kF32 && ins.size() == 2 && onednn_gemm_enabled())
    if (auto causal = make_onednn_causal_matmul(attrs, ins[0], ins[1], out)) return causal;
  if (out.dtype != DType::kBF16 || !use_onednn_bf16()) return nullptr;
  switch (op) {
    case Op::kMatmul:  // the accumulating form (4 operands) is f32/f64 only (fuse_gemm_accumulate)
      return ins.size() == 2 ? make_onednn_matmul(attrs, ins[0], ins[1], out) : nullptr;
    case Op::kConv2dGradInput:
      // oneDNN's blocked layouts pad channels to blocks of 16: with fewer than 8 input channels
      // its input gradient ran at 0.3-0.6x the convert path (1 and 3 channels, 28x28, in
      // bench/runtime/bf16_gemm_bench), at 8 channels 1.1-1.3x. Forward and weight gradient won
      // at every width measured (1.6x and more).
      if (out.shape[1] < kOnednnGradInputMinChannels) return nullptr;
      return make_onednn_conv(op, attrs, ins, out, ConvLayout::kChosen);
    case Op::kConv2d: case Op::kConv2dGradWeight:
      return make_onednn_conv(op, attrs, ins, out, ConvLayout::kChosen);
    default:
      return nullptr;
  }
}

void gemm_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b,
              float* c) {
  gemm<float>(ta, tb, m, n, k, a, b, c);
}

void matmul_kernel(const Attrs& attrs, const Arg& a, const Arg& b, const Arg& out) {
  const Shape &as = a.type->shape, &bs = b.type->shape, &cs = out.type->shape;
  switch (out.type->dtype) {
    case DType::kF32:
      return batched(attrs, static_cast<const float*>(a.data), as,
                     static_cast<const float*>(b.data), bs, static_cast<float*>(out.data), cs);
    case DType::kF64:
      return batched(attrs, static_cast<const double*>(a.data), as,
                     static_cast<const double*>(b.data), bs, static_cast<double*>(out.data), cs);
    case DType::kI32:
      return batched(attrs, static_cast<const int32_t*>(a.data), as,
                     static_cast<const int32_t*>(b.data), bs, static_cast<int32_t*>(out.data), cs);
    case DType::kI64:
      return batched(attrs, static_cast<const int64_t*>(a.data), as,
                     static_cast<const int64_t*>(b.data), bs, static_cast<int64_t*>(out.data), cs);
    case DType::kBF16: {
      // The products write every output element (beta = 0).
      const float* af = to_float(a.data, numel(as), 0);
      const float* bf = to_float(b.data, numel(bs), 1);
      float* cf = f32_scratch(2, numel(cs));
      batched(attrs, af, as, bf, bs, cf, cs);
      return from_float(cf, numel(cs), out.data);
    }
    case DType::kBool:
      XS_CHECK(false, "matmul on bool is rejected by the shape rule");
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
    cblas_sgemm(CblasRowMajor, to(ta), to(tb), m, n, k, 1.0f,
                static_cast<const float*>(ins[0].data), lda, static_cast<const float*>(ins[1].data),
                ldb, beta, static_cast<float*>(out.data), n);
  } else {
    XS_CHECK(out.type->dtype == DType::kF64, "accumulating matmul on {}",
             dtype_name(out.type->dtype));
    const double beta = *static_cast<const double*>(ins[3].data);
    cblas_dgemm(
        CblasRowMajor, to(ta), to(tb), m, n, k, 1.0, static_cast<const double*>(ins[0].data), lda,
        static_cast<const double*>(ins[1].data), ldb, beta, static_cast<double*>(out.data), n);
  }
}

namespace {

// Per-thread scratch that outlives kernel calls, one buffer per role: a fresh std::vector per
// call zero-filled megabytes per step and faulted its pages in again. Contents are undefined
// on entry. Roles start kSkewBytes apart mod 4096, so buffers used together (im2col matrix,
// conv output, routed gradient) never start on the same L1 set (no measurable effect here,
// but nothing to lose).
enum Role {
  kCols = 0,
  kConvOut = 1,
  kRouted = 2,
  kPadded = 3,
  kPart = 4,
  kWeights = 5,
  kRoles = 6
};
constexpr int64_t kSkewBytes = 9 * 64;

template <typename T>
T* scratch(Role role, int64_t n) {
  struct Buf {
    T* base = nullptr;
    int64_t cap = 0;
    ~Buf() { std::free(base); }
  };
  thread_local Buf bufs[kRoles];
  Buf& b = bufs[role];
  const int64_t skew = role * kSkewBytes % 4096 / static_cast<int64_t>(sizeof(T));
  if (n + skew > b.cap) {
    std::free(b.base);
    const size_t bytes = (static_cast<size_t>(n + skew) * sizeof(T) + 4095) / 4096 * 4096;
    b.base = static_cast<T*>(std::aligned_alloc(4096, bytes));
    XS_CHECK(b.base != nullptr, "scratch of {} bytes: out of memory", bytes);
    b.cap = static_cast<int64_t>(bytes / sizeof(T));
  }
  return b.base + skew;
}

// Asks for [p, p + bytes) in cache ahead of use. The per-sample loops below read each sample's
// inputs (a few tens of KB) once, after the previous sample's GEMMs have pushed everything
// else out of cache; fetching the next sample's inputs while those GEMMs run hides the wait
// (it was most of the gradient routing's and the row matrix's time). T0 rather than T1 (L2):
// about 1% of the CNN step faster in interleaved runs, though the GEMMs evict part of it.
inline void prefetch_next(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(c + i, _MM_HINT_T0);
}

inline RowGeom row_geom(const Shape& xs, const Shape& ws, const int64_t* p, int64_t oh,
                        int64_t ow) {
  return {xs[1], xs[2], xs[3], ws[0], ws[2], ws[3], p[2], p[3], oh, ow};
}

// One sample's convolution output y[o][oy*ow + ox], by kernel rows (conv_rows.h) or by im2col
// + one GEMM. The plain and the fused layer kernel both use it, so they agree bit for bit.
template <typename T>
struct ConvForward {
  const int64_t* p;
  RowGeom g;
  const T* wt;
  bool rows;
  T *wr = nullptr, *cols = nullptr, *pad = nullptr;

  ConvForward(const int64_t* p_, const Shape& xs, const Shape& ws, int64_t oh, int64_t ow,
              const T* wt_)
      : p(p_), g(row_geom(xs, ws, p_, oh, ow)), wt(wt_), rows(use_rows(p_, g.c, g.kw)) {
    cols = scratch<T>(kCols, rows ? g.kr() * g.ldx() : g.c * g.kh * g.kw * g.np());
    pad = scratch<T>(kPadded, im2col_pad_size(g.c, g.h, g.w, p));
    if (rows) {
      wr = scratch<T>(kWeights, g.o * g.c * g.kh * g.kw);
      reorder_weights(wt, g, wr);
    }
  }
  // `again`: the previous call was this object's too (its row matrix's padding rows stand).
  void sample(const T* x, T* y, bool again) const {
    if (rows) {
      rows_matrix(x, g, cols, pad, again);
      return rows_forward(wr, cols, g, y);
    }
    im2col(x, g.c, g.h, g.w, g.kh, g.kw, p, g.oh, g.ow, cols, pad);
    gemm<T>(false, false, g.o, g.np(), g.c * g.kh * g.kw, wt, cols, y);
  }
};

template <typename T>
void conv2d_typed(const int64_t* p, const T* x, const Shape& xs, const T* wt, const Shape& ws,
                  T* out, const Shape& os) {
  const ConvForward<T> conv(p, xs, ws, os[2], os[3], wt);
  const int64_t in_sample = xs[1] * xs[2] * xs[3], out_sample = ws[0] * os[2] * os[3];
  for (int64_t b = 0; b < xs[0]; ++b) {
    if (b + 1 < xs[0]) prefetch_next(x + (b + 1) * in_sample, in_sample * sizeof(T));
    conv.sample(x + b * in_sample, out + b * out_sample, b > 0);
  }
}

// conv2d(x, w, bias), the layer conv-bias-relu-2x2-pool: per sample the convolution output
// goes into a scratch that stays in cache, and only the pooled values and the argmax
// positions are stored (out = [2][n][o][oh/2][ow/2]).
template <typename T>
void conv_pool_typed(const int64_t* p, const T* x, const Shape& xs, const T* wt, const Shape& ws,
                     const T* bias, T* out, const Shape& os) {
  const int64_t n = xs[0], o = ws[0], oh = 2 * os[3], ow = 2 * os[4], pooled = o * os[3] * os[4];
  const ConvForward<T> conv(p, xs, ws, oh, ow, wt);
  T* y = scratch<T>(kConvOut, o * oh * ow);
  const int64_t in_sample = xs[1] * xs[2] * xs[3];
  for (int64_t b = 0; b < n; ++b) {
    if (b + 1 < n) prefetch_next(x + (b + 1) * in_sample, in_sample * sizeof(T));
    conv.sample(x + b * in_sample, y, b > 0);
    max_pool2d_argmax_planes(y, bias, o, oh, ow, out + b * pooled, out + (n + b) * pooled);
  }
}

}  // namespace

void conv2d_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out) {
  const int64_t* p = attrs.ints.data();
  const Arg &x = ins[0], &w = ins[1];
  const Shape &xs = x.type->shape, &ws = w.type->shape, &os = out.type->shape;
  if (ins.size() == 3) {
    return with_float(out.type->dtype, ins, out, [&](const auto& in, auto* o) {
      conv_pool_typed(p, in[0], xs, in[1], ws, in[2], o, os);
    });
  }
  switch (out.type->dtype) {
    case DType::kF32:
      return conv2d_typed(p, static_cast<const float*>(x.data), xs,
                          static_cast<const float*>(w.data), ws, static_cast<float*>(out.data), os);
    case DType::kF64:
      return conv2d_typed(p, static_cast<const double*>(x.data), xs,
                          static_cast<const double*>(w.data), ws, static_cast<double*>(out.data),
                          os);
    case DType::kBF16: {
      const float* xf = to_float(x.data, numel(xs), 0);
      const float* wf = to_float(w.data, numel(ws), 1);
      float* of = f32_scratch(2, numel(os));  // every element written (im2col + GEMM, beta = 0)
      conv2d_typed(p, xf, xs, wf, ws, of, os);
      return from_float(of, numel(os), out.data);
    }
    default:
      XS_CHECK(false, "conv2d on {} is rejected by the shape rule", dtype_name(out.type->dtype));
  }
}

}  // namespace xs::detail

// Gradients of conv2d: the adjoints of the forward kernel above.
namespace xs::detail {
namespace {

// The conv output's gradient, one sample at a time: grad_out itself, or (fused) routed from
// the pooled gradient h by the max pool over y.
template <typename T>
struct GradOut {
  const T* g;                     // grad_out [n][o][oh][ow], or h [n][o][gh][gw]
  const int64_t* pool = nullptr;  // the max pool's 6 attrs when fused
  const T* y = nullptr;           // the pool's input [n][o][oh][ow] (fused)
  const T* bias = nullptr;        // its bias, if the pooled input was relu(y + bias)
  int64_t o = 0, oh = 0, ow = 0, gh = 0, gw = 0;

  const T* argmax = nullptr;  // (fused forward) the conv2d's [2][n][o][gh][gw] result
  int64_t n = 0;

  const T* sample(int64_t b) const {
    if (argmax != nullptr) {
      T* routed = scratch<T>(kRouted, o * oh * ow);
      const int64_t pooled = o * gh * gw;
      max_pool2d_route_planes(argmax + (n + b) * pooled, g + b * pooled, o, oh, ow, routed);
      return routed;
    }
    if (pool == nullptr) return g + b * o * oh * ow;
    T* routed = scratch<T>(kRouted, o * oh * ow);
    max_pool2d_grad_planes(pool, y + b * o * oh * ow, g + b * o * gh * gw, bias, o, oh, ow, routed);
    return routed;
  }
  // What sample(b) will read, into cache ahead of it (see prefetch_next).
  void prefetch(int64_t b) const {
    const int64_t bytes = o * gh * gw * static_cast<int64_t>(sizeof(T));
    if (argmax != nullptr) {
      prefetch_next(g + b * o * gh * gw, bytes);
      return prefetch_next(argmax + (n + b) * o * gh * gw, bytes);
    }
    if (pool != nullptr)
      prefetch_next(y + b * o * oh * ow, o * oh * ow * static_cast<int64_t>(sizeof(T)));
    prefetch_next(g + b * o * gh * gw, bytes);
  }
};

// ins[gi] is grad_out, or h with ins[2] = y and ins[3] = bias (optional).
template <typename T>
GradOut<T> grad_out_of(const Attrs& attrs, std::span<const Arg> ins,
                       const std::vector<const T*>& in, size_t gi) {
  const Shape& gs = ins[gi].type->shape;
  if (ins.size() == 2)
    return {in[gi], nullptr, nullptr, nullptr, gs[1], gs[2], gs[3], gs[2], gs[3]};
  if (ins[2].type->shape.size() == 5) {  // h with the fused conv2d's argmax positions
    GradOut<T> go{in[gi], nullptr, nullptr, nullptr, gs[1], 2 * gs[2], 2 * gs[3], gs[2], gs[3]};
    go.argmax = in[2];
    go.n = gs[0];
    return go;
  }
  const Shape& ys = ins[2].type->shape;
  return {in[gi], attrs.ints.data() + 6,
          in[2],  ins.size() == 4 ? in[3] : nullptr,
          ys[1],  ys[2],
          ys[3],  gs[2],
          gs[3]};
}

template <typename T>
void conv_grad_input_typed(const int64_t* p, int64_t n, const GradOut<T>& go, const T* wt,
                           const Shape& ws, T* out, const Shape& os) {
  const int64_t o = go.o, oh = go.oh, ow = go.ow, c = ws[1], kh = ws[2], kw = ws[3];
  const int64_t h = os[2], w = os[3], ckk = c * kh * kw;
  if (use_rows(p, c, kw)) {
    const RowGeom g{c, h, w, o, kh, kw, p[2], p[3], oh, ow};
    T* wr = scratch<T>(kWeights, o * ckk);
    reorder_weights(wt, g, wr);
    T* z = scratch<T>(kCols, g.kr() * g.ldx());
    for (int64_t b = 0; b < n; ++b) {
      if (b + 1 < n) go.prefetch(b + 1);
      rows_grad_input(wr, go.sample(b), g, z, out + b * c * h * w);
    }
    return;
  }
  T* cols = scratch<T>(kCols, ckk * oh * ow);
  if (p[0] == 1 && p[1] == 1) {
    // `out` is written once per sample, never zero-filled and re-read.
    for (int64_t b = 0; b < n; ++b) {
      if (b + 1 < n) go.prefetch(b + 1);
      gemm<T>(true, false, ckk, oh * ow, o, wt, go.sample(b), cols);
      col2im_unit_direct(cols, c, h, w, kh, kw, p[2], p[3], oh, ow, out + b * c * h * w);
    }
    return;
  }
  std::fill(out, out + numel(os), T(0));
  for (int64_t b = 0; b < n; ++b) {
    gemm<T>(true, false, ckk, oh * ow, o, wt, go.sample(b), cols);
    col2im(cols, c, h, w, kh, kw, p, oh, ow, out + b * c * h * w);
  }
}

template <typename T>
void conv_grad_weight_typed(const int64_t* p, const T* x, const Shape& xs, const GradOut<T>& go,
                            T* out, const Shape& os) {
  const int64_t n = xs[0], c = xs[1], h = xs[2], w = xs[3], o = go.o, oh = go.oh, ow = go.ow;
  const int64_t kh = os[2], kw = os[3], ckk = c * kh * kw;
  T* pad = scratch<T>(kPadded, im2col_pad_size(c, h, w, p));
  const auto prefetch_after = [&](int64_t b) {  // sample b + 1's input and gradient
    if (b + 1 == n) return;
    prefetch_next(x + (b + 1) * c * h * w, c * h * w * static_cast<int64_t>(sizeof(T)));
    go.prefetch(b + 1);
  };
  if (use_rows(p, c, kw)) {
    const RowGeom g{c, h, w, o, kh, kw, p[2], p[3], oh, ow};
    T* xr = scratch<T>(kCols, g.kr() * g.ldx());
    T* dwr = scratch<T>(kPart, o * ckk);
    if (n == 0) std::fill(dwr, dwr + o * ckk, T(0));
    for (int64_t b = 0; b < n; ++b) {
      prefetch_after(b);
      rows_matrix(x + b * c * h * w, g, xr, pad, b > 0);
      rows_grad_weight(go.sample(b), xr, g, b == 0, dwr);
    }
    return unorder_weights(dwr, g, out);
  }
  std::fill(out, out + numel(os), T(0));
  T* cols = scratch<T>(kCols, ckk * oh * ow);
  if constexpr (std::is_same_v<T, float>) {
    // Accumulate over the batch inside the GEMM (beta = 1): no per-sample partial to add.
    const blasint m = static_cast<blasint>(o), nn = static_cast<blasint>(ckk),
                  k = static_cast<blasint>(oh * ow);
    for (int64_t b = 0; b < n; ++b) {
      prefetch_after(b);
      im2col(x + b * c * h * w, c, h, w, kh, kw, p, oh, ow, cols, pad);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nn, k, 1.0f, go.sample(b), k, cols, k,
                  b == 0 ? 0.0f : 1.0f, out, nn);
    }
    return;
  }
  T* part = scratch<T>(kPart, o * ckk);
  for (int64_t b = 0; b < n; ++b) {
    im2col(x + b * c * h * w, c, h, w, kh, kw, p, oh, ow, cols, pad);
    gemm<T>(false, true, o, ckk, oh * ow, go.sample(b), cols, part);
    for (int64_t i = 0; i < o * ckk; ++i) out[i] += part[i];
  }
}

}  // namespace

void conv2d_grad_input_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out) {
  with_float(out.type->dtype, ins, out, [&](const auto& in, auto* o) {
    using T = std::remove_cv_t<std::remove_pointer_t<std::decay_t<decltype(in[0])>>>;
    const GradOut<T> go = grad_out_of<T>(attrs, ins, in, 0);
    conv_grad_input_typed(attrs.ints.data(), ins[0].type->shape[0], go, in[1], ins[1].type->shape,
                          o, out.type->shape);
  });
}

void conv2d_grad_weight_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out) {
  with_float(out.type->dtype, ins, out, [&](const auto& in, auto* o) {
    using T = std::remove_cv_t<std::remove_pointer_t<std::decay_t<decltype(in[0])>>>;
    const GradOut<T> go = grad_out_of<T>(attrs, ins, in, 1);
    conv_grad_weight_typed(attrs.ints.data(), in[0], ins[0].type->shape, go, o, out.type->shape);
  });
}

}  // namespace xs::detail
