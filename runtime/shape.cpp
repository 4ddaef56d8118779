#include "xla_spawn/runtime/shape.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "xla_spawn/base/error.h"

namespace xs {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  bool empty = false;
  bool overflow = false;
  for (int64_t d : shape) {
    if (d < 0) {
      throw InvalidArgument(fmt::format("shape {}: dimension {} is negative", shape_str(shape), d));
    }
    empty = empty || d == 0;
    overflow = overflow || __builtin_mul_overflow(n, d, &n) || n > kMaxNumel;
  }
  if (empty) return 0;
  if (overflow) {
    throw InvalidArgument(fmt::format("shape {}: more than 2^56 elements", shape_str(shape)));
  }
  return n;
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * shape[i + 1];
  }
  return strides;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw InvalidArgument(fmt::format("{}: shapes {} and {} do not broadcast (axis {}: {} vs {})",
                                        op, shape_str(a), shape_str(b), i, da, db));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> broadcast_strides(const Shape& from, const Shape& to) {
  std::vector<int64_t> strides(to.size(), 0);
  const std::vector<int64_t> own = contiguous_strides(from);
  const size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i) {
    strides[lead + i] = from[i] == 1 ? 0 : own[i];
  }
  return strides;
}

int64_t normalize_axis(int64_t axis, int64_t rank, std::string_view op) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) {
    throw InvalidArgument(fmt::format("{}: axis {} out of range for rank {}", op, axis, rank));
  }
  return a;
}

}  // namespace xs
