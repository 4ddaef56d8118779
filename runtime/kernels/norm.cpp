// Row-wise kernels over the last axis: layer normalisation and its two gradients, softmax
// (optionally causal) and its gradient. Every row is computed on its own, its sums taken in
// double in a fixed order that depends only on the row's length (row_sum.h), so results do not
// depend on how rows are split and replicas agree bit for bit. The gradients recompute a row's
// mean and inverse standard deviation (two passes over D elements) instead of keeping them
// from the forward.
#include <algorithm>
#include <cmath>
#include <vector>

#include "xla_spawn/runtime/kernels/elementary.h"
#include "xla_spawn/runtime/kernels/float_args.h"
#include "xla_spawn/runtime/kernels/kernels.h"
#include "xla_spawn/runtime/kernels/row_sum.h"

namespace xs::detail {
namespace {

struct RowStats {
  double mean, rstd;
};

template <typename T>
RowStats row_stats(const T* x, int64_t d, double eps) {
  const double mean = row_sum(d, [&](int64_t j) { return static_cast<double>(x[j]); }) / static_cast<double>(d);
  const double sq = row_sum(d, [&](int64_t j) { return (x[j] - mean) * (x[j] - mean); });
  return {mean, 1.0 / std::sqrt(sq / static_cast<double>(d) + eps)};
}

template <typename T>
void forward_rows(const T* x, const T* gamma, const T* beta, T* y, int64_t rows, int64_t d, double eps) {
  for (int64_t r = 0; r < rows; ++r, x += d, y += d) {
    const RowStats s = row_stats(x, d, eps);
    for (int64_t j = 0; j < d; ++j) y[j] = static_cast<T>((x[j] - s.mean) * s.rstd * gamma[j] + beta[j]);
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = grad_y * gamma.
template <typename T>
void grad_input_rows(const T* x, const T* gamma, const T* gy, T* dx, int64_t rows, int64_t d, double eps) {
  for (int64_t r = 0; r < rows; ++r, x += d, gy += d, dx += d) {
    const RowStats s = row_stats(x, d, eps);
    const double g_sum = row_sum(d, [&](int64_t j) { return static_cast<double>(gy[j]) * gamma[j]; });
    const double gx_sum = row_sum(d, [&](int64_t j) {
      return static_cast<double>(gy[j]) * gamma[j] * (x[j] - s.mean) * s.rstd;
    });
    const double g_mean = g_sum / static_cast<double>(d), gx_mean = gx_sum / static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) {
      const double xhat = (x[j] - s.mean) * s.rstd;
      dx[j] = static_cast<T>(s.rstd * (static_cast<double>(gy[j]) * gamma[j] - g_mean - xhat * gx_mean));
    }
  }
}

// dgamma[j] = sum over rows of grad_y * xhat, rows added in order.
template <typename T>
void grad_gamma_rows(const T* x, const T* gy, T* dgamma, int64_t rows, int64_t d, double eps) {
  std::vector<double> acc(static_cast<size_t>(d), 0.0);
  for (int64_t r = 0; r < rows; ++r, x += d, gy += d) {
    const RowStats s = row_stats(x, d, eps);
    for (int64_t j = 0; j < d; ++j) acc[j] += static_cast<double>(gy[j]) * ((x[j] - s.mean) * s.rstd);
  }
  for (int64_t j = 0; j < d; ++j) dgamma[j] = static_cast<T>(acc[j]);
}

// Row r of a causal softmax over [..., T, T] is position r % T: columns after it are masked.
int64_t valid_columns(const Attrs& attrs, int64_t row, int64_t d) {
  return attrs.flag == 1 ? row % d + 1 : d;
}

template <typename T>
void softmax_rows(const Attrs& attrs, const T* x, T* y, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r, x += d, y += d) {
    const int64_t n = valid_columns(attrs, r, d);
    const T top = row_max(x, n);
    for (int64_t j = 0; j < n; ++j) y[j] = exp_of(x[j] - top);
    const double total = row_sum(n, [&](int64_t j) { return static_cast<double>(y[j]); });
    const T scale = static_cast<T>(1.0 / total);
    for (int64_t j = 0; j < n; ++j) y[j] *= scale;
    std::fill(y + n, y + d, T(0));
  }
}

// dx = y * (g - sum(y * g)); masked columns have y = 0 and get 0.
template <typename T>
void softmax_grad_rows(const Attrs& attrs, const T* y, const T* g, T* dx, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r, y += d, g += d, dx += d) {
    const int64_t n = valid_columns(attrs, r, d);
    const T t = static_cast<T>(row_sum(n, [&](int64_t j) { return static_cast<double>(y[j]) * g[j]; }));
    for (int64_t j = 0; j < n; ++j) dx[j] = y[j] * (g[j] - t);
    std::fill(dx + n, dx + d, T(0));
  }
}

}  // namespace

void softmax_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out) {
  const int64_t d = ins[0].type->shape.back(), rows = d == 0 ? 0 : numel(ins[0].type->shape) / d;
  with_float(out.type->dtype, ins, out, [&](const auto& in, auto* o) {
    if (ins.size() == 1) return softmax_rows(attrs, in[0], o, rows, d);
    softmax_grad_rows(attrs, in[0], in[1], o, rows, d);
  });
}

void layer_norm_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out) {
  const Shape& xs = ins[0].type->shape;
  const int64_t d = xs.back(), rows = d == 0 ? 0 : numel(xs) / d;
  with_float(out.type->dtype, ins, out, [&](const auto& in, auto* y) {
    forward_rows(in[0], in[1], in[2], y, rows, d, attrs.scalar);
  });
}

void layer_norm_grad_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out) {
  const Shape& xs = ins[0].type->shape;
  const int64_t d = xs.back(), rows = d == 0 ? 0 : numel(xs) / d;
  with_float(out.type->dtype, ins, out, [&](const auto& in, auto* o) {
    if (attrs.flag == 0) return grad_input_rows(in[0], in[1], in[2], o, rows, d, attrs.scalar);
    grad_gamma_rows(in[0], in[2], o, rows, d, attrs.scalar);
  });
}

}  // namespace xs::detail
