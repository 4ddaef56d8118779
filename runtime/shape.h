#pragma once
// Tensor shapes: a list of dimension sizes (row-major, contiguous), with the helpers the
// shape rules and kernels share: element counts, strides, numpy broadcasting, axis checks.
//
//   Shape out = broadcast_shapes({4, 1, 3}, {5, 3}, "add");   // {4, 5, 3}
//   int64_t n = numel(out);                                    // 60

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace xs {

using Shape = std::vector<int64_t>;

// Throws xs::InvalidArgument for a negative dimension or more than kMaxNumel elements (far
// beyond any memory: the byte counts computed from it cannot overflow).
int64_t numel(const Shape& shape);
inline constexpr int64_t kMaxNumel = int64_t{1} << 56;
std::string shape_str(const Shape& shape);  // "[4, 5, 3]"
// Row-major strides in elements.
std::vector<int64_t> contiguous_strides(const Shape& shape);
// Numpy broadcasting; throws InvalidArgument naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);
// Strides (elements) for reading `from` as if broadcast to `to`: 0 on broadcast axes.
std::vector<int64_t> broadcast_strides(const Shape& from, const Shape& to);
// Maps a possibly negative axis into [0, rank); throws naming `op` when out of range.
int64_t normalize_axis(int64_t axis, int64_t rank, std::string_view op);

}  // namespace xs
