// Gather, one-hot and the counter-based random number kernels.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/kernels/float_args.h"
#include "xla_spawn/runtime/kernels/kernels.h"
#include "xla_spawn/runtime/element.h"
#include "xla_spawn/runtime/kernels/random.h"

namespace xs::detail {

void gather_kernel(const Attrs& attrs, const Arg& x, const Arg& index, const Arg& out) {
  const int64_t axis = attrs.ints[0];
  const Shape& os = out.type->shape;
  const int64_t limit = x.type->shape[axis];
  const std::vector<int64_t> xs = contiguous_strides(x.type->shape);
  const size_t sz = dtype_size(x.type->dtype);
  const int64_t n = numel(os), rank = static_cast<int64_t>(os.size());
  std::vector<int64_t> coord(rank, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = load_element_i64(index.data, index.type->dtype, i);
    if (k < 0 || k >= limit) {
      throw InvalidArgument(fmt::format("gather: index {} at position {} is out of range [0, {}) on axis {}",
                                        k, i, limit, axis));
    }
    int64_t off = 0;
    for (int64_t d = 0; d < rank; ++d) off += (d == axis ? k : coord[d]) * xs[d];
    std::memcpy(static_cast<char*>(out.data) + i * sz, static_cast<const char*>(x.data) + off * sz, sz);
    for (int64_t d = rank - 1; d >= 0; --d) {
      if (++coord[d] < os[d]) break;
      coord[d] = 0;
    }
  }
}

void one_hot_kernel(const Attrs& attrs, const Arg& index, const Arg& out) {
  fill_kernel(0, out);
  const int64_t classes = attrs.ints[0];
  const int64_t n = numel(index.type->shape);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = load_element_i64(index.data, index.type->dtype, i);
    if (k < 0 || k >= classes) {
      throw InvalidArgument(fmt::format("one_hot: index {} at position {} is out of range [0, {})", k, i,
                                        classes));
    }
    store_element(out.data, out.type->dtype, i * classes + k, 1.0);
  }
}

// The op kernel of a draw: random.h's formula element by element (loops fuse the same
// formula; this is their reference).
void random_kernel(Op op, const Attrs&, std::span<const Arg> ins, const Arg& out) {
  const uint64_t seed = static_cast<uint64_t>(*static_cast<const int64_t*>(ins[0].data));
  const int64_t n = numel(out.type->shape);
  const DType dt = out.type->dtype;
  const double p = op == Op::kBernoulli ? *static_cast<const float*>(ins[1].data) : 0;
  for (int64_t i = 0; i < n; ++i) store_element(out.data, dt, i, random_value(op, dt, seed, static_cast<uint64_t>(i), p));
}

}  // namespace xs::detail

namespace xs::detail {
namespace {

int64_t table_row(const Arg& index, int64_t i, int64_t rows, const char* op) {
  const int64_t k = load_element_i64(index.data, index.type->dtype, i);
  if (k < 0 || k >= rows) {
    throw InvalidArgument(fmt::format("{}: index {} at position {} is out of range [0, {}) (the table's rows)",
                                      op, k, i, rows));
  }
  return k;
}

}  // namespace

void embedding_kernel(const Arg& table, const Arg& index, const Arg& out) {
  const int64_t rows = table.type->shape[0];
  const size_t row_bytes = static_cast<size_t>(table.type->shape[1]) * dtype_size(table.type->dtype);
  const int64_t n = numel(index.type->shape);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = table_row(index, i, rows, "embedding");
    std::memcpy(static_cast<char*>(out.data) + i * row_bytes,
                static_cast<const char*>(table.data) + k * row_bytes, row_bytes);
  }
}

void embedding_grad_kernel(const Arg& index, const Arg& grad, const Arg& out) {
  const int64_t rows = out.type->shape[0], d = out.type->shape[1];
  const int64_t n = numel(index.type->shape);
  with_float(out.type->dtype, std::span<const Arg>(&grad, 1), out, [&](const auto& in, auto* table) {
    std::fill(table, table + rows * d, 0);
    for (int64_t i = 0; i < n; ++i) {
      auto* row = table + table_row(index, i, rows, "embedding_grad") * d;
      const auto* g = in[0] + i * d;
      for (int64_t j = 0; j < d; ++j) row[j] += g[j];
    }
  });
}

void scatter_add_kernel(const Attrs& attrs, const Arg& index, const Arg& src, const Arg& out) {
  fill_kernel(0, out);
  const int64_t axis = attrs.ints[0];
  const Shape& is = index.type->shape;
  const Shape& os = out.type->shape;
  const std::vector<int64_t> ostr = contiguous_strides(os);
  const int64_t n = numel(is), rank = static_cast<int64_t>(is.size());
  std::vector<int64_t> coord(rank, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = load_element_i64(index.data, index.type->dtype, i);
    if (k < 0 || k >= os[axis]) {
      throw InvalidArgument(fmt::format("scatter_add: index {} at position {} is out of range [0, {}) on axis {}",
                                        k, i, os[axis], axis));
    }
    int64_t off = 0;
    for (int64_t d = 0; d < rank; ++d) off += (d == axis ? k : coord[d]) * ostr[d];
    const DType dt = out.type->dtype;
    if (dt == DType::kI64) static_cast<int64_t*>(out.data)[off] += static_cast<const int64_t*>(src.data)[i];
    else store_element(out.data, dt, off, load_element(out.data, dt, off) + load_element(src.data, dt, i));
    for (int64_t d = rank - 1; d >= 0; --d) {
      if (++coord[d] < is[d]) break;
      coord[d] = 0;
    }
  }
}

}  // namespace xs::detail
