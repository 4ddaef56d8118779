// 2-D pooling (max, average) and its gradients over NCHW planes, with fast paths for unpadded
// windows and the usual 2x2 / stride 2 max pool (branch-free, so the loops vectorise).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/check.h"
#include "runtime/detail/float_args.h"
#include "runtime/detail/kernels.h"

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

template <typename T>
void pool_typed(bool is_max, const int64_t* p, const T* x, const Shape& xs, T* out,
                const Shape& os) {
  if (is_max && p[0] == 2 && p[1] == 2 && p[2] == 2 && p[3] == 2 && p[4] == 0 && p[5] == 0)
    return max_pool_2x2(x, xs[0] * xs[1], xs[2], xs[3], out, os[2], os[3]);
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
template <typename T>
void max_pool_grad_2x2(const T* x, const T* g, int64_t planes, int64_t h, int64_t w, T* out) {
  const int64_t oh = h / 2, ow = w / 2;
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t oy = 0; oy < oh; ++oy) {
      const int64_t r0 = (pl * h + 2 * oy) * w, r1 = r0 + w;
      const T* gr = g + (pl * oh + oy) * ow;
      for (int64_t ox = 0; ox < ow; ++ox) {
        // Row-major first maximum: the winner of each row pair (ties: left), then the bottom
        // one only if it takes over the top one (ties: top). Selects only, no branches.
        const T a = x[r0 + 2 * ox], b = x[r0 + 2 * ox + 1], c = x[r1 + 2 * ox],
                d = x[r1 + 2 * ox + 1];
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

template <typename T>
void pool_grad_typed(bool is_max, const int64_t* p, const T* x, const T* g, const Shape& gs, T* out,
                     const Shape& os) {
  const int64_t planes = os[0] * os[1], h = os[2], w = os[3], oh = gs[2], ow = gs[3];
  if (is_max && p[0] == 2 && p[1] == 2 && p[2] == 2 && p[3] == 2 && p[4] == 0 && p[5] == 0 &&
      h % 2 == 0 && w % 2 == 0)
    return max_pool_grad_2x2(x, g, planes, h, w, out);
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

void pool2d_kernel(Op op, const Attrs& attrs, const Arg& x, const Arg& out) {
  const bool is_max = op == Op::kMaxPool2d;
  const int64_t* p = attrs.ints.data();
  const Shape &xs = x.type->shape, &os = out.type->shape;
  switch (out.type->dtype) {
    case DType::kF32:
      return pool_typed(is_max, p, static_cast<const float*>(x.data), xs,
                        static_cast<float*>(out.data), os);
    case DType::kF64:
      return pool_typed(is_max, p, static_cast<const double*>(x.data), xs,
                        static_cast<double*>(out.data), os);
    case DType::kBF16: {
      const std::vector<float> xf = to_float(x.data, numel(xs));
      std::vector<float> of(numel(os));
      pool_typed(is_max, p, xf.data(), xs, of.data(), os);
      return from_float(of, out.data);
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
                    g.type->shape, o, out.type->shape);
  });
}

}  // namespace xs::detail
