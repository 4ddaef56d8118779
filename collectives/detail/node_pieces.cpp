#include "xla_spawn/collectives/detail/node_pieces.h"

#include <algorithm>

#include "xla_spawn/shm/layout.h"

namespace xs::detail {
namespace {

size_t line_elems(size_t elem_bytes) {
  return std::max<size_t>(1, shm::kCacheLineBytes / elem_bytes);
}

// bounds[l] of node_cut. 128-bit product: n_elems * l must not wrap for any size_t count.
size_t cut_point(size_t n_elems, int node_size, int l, size_t line) {
  if (l >= node_size) return n_elems;
  const unsigned __int128 exact = static_cast<unsigned __int128>(n_elems) *
                                  static_cast<unsigned>(l) / static_cast<unsigned>(node_size);
  const unsigned __int128 rounded = (exact + line - 1) / line * line;
  return static_cast<size_t>(std::min<unsigned __int128>(rounded, n_elems));
}

int holding(size_t offset, size_t n_elems, int node_size, size_t line) {
  int lo = 0, hi = node_size - 1;  // invariant: cut_point(lo) <= offset, answer in [lo, hi]
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (cut_point(n_elems, node_size, mid, line) <= offset) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// `points` sorted and unique: one piece per gap, with its holder on every node.
std::vector<CutPiece> pieces_between(const std::vector<size_t>& points, size_t n_elems,
                                     std::span<const int> node_sizes, size_t line) {
  std::vector<CutPiece> pieces;
  if (points.size() < 2) return pieces;
  pieces.reserve(points.size() - 1);
  for (size_t i = 0; i + 1 < points.size(); ++i) {
    CutPiece piece{points[i], points[i + 1] - points[i], {}};
    piece.holders.reserve(node_sizes.size());
    for (int size : node_sizes) piece.holders.push_back(holding(points[i], n_elems, size, line));
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

void add_extra_cuts(std::vector<size_t>& points, std::span<const size_t> extra_cuts, size_t begin,
                    size_t end) {
  for (size_t p : extra_cuts) {
    if (p > begin && p < end) points.push_back(p);
  }
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
}

}  // namespace

std::vector<size_t> node_cut(size_t n_elems, int node_size, size_t elem_bytes) {
  std::vector<size_t> bounds(static_cast<size_t>(node_size) + 1);
  for (int l = 0; l <= node_size; ++l) {
    bounds[l] = cut_point(n_elems, node_size, l, line_elems(elem_bytes));
  }
  return bounds;
}

int range_holding(size_t offset, size_t n_elems, int node_size, size_t elem_bytes) {
  return holding(offset, n_elems, node_size, line_elems(elem_bytes));
}

std::vector<CutPiece> all_pieces(size_t n_elems, size_t elem_bytes, std::span<const int> node_sizes,
                                 std::span<const size_t> extra_cuts) {
  const size_t line = line_elems(elem_bytes);
  std::vector<size_t> points = {0, n_elems};
  for (int size : node_sizes) {
    for (int l = 1; l < size; ++l) points.push_back(cut_point(n_elems, size, l, line));
  }
  add_extra_cuts(points, extra_cuts, 0, n_elems);
  return pieces_between(points, n_elems, node_sizes, line);
}

// Only the cut points inside this replica's range matter: on each node they are the bounds
// after the one that holds the range's start, up to the range's end.
std::vector<CutPiece> pieces_of(size_t n_elems, size_t elem_bytes, std::span<const int> node_sizes,
                                int node, int local_ordinal, std::span<const size_t> extra_cuts) {
  const size_t line = line_elems(elem_bytes);
  const size_t begin = cut_point(n_elems, node_sizes[node], local_ordinal, line);
  const size_t end = cut_point(n_elems, node_sizes[node], local_ordinal + 1, line);
  if (begin >= end) return {};
  std::vector<size_t> points = {begin, end};
  for (int size : node_sizes) {
    for (int l = holding(begin, n_elems, size, line) + 1; l < size; ++l) {
      const size_t p = cut_point(n_elems, size, l, line);
      if (p >= end) break;
      points.push_back(p);
    }
  }
  add_extra_cuts(points, extra_cuts, begin, end);
  return pieces_between(points, n_elems, node_sizes, line);
}

}  // namespace xs::detail
