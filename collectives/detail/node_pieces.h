#pragma once
// How the hierarchical collectives (multi_host_communicator.h) divide a buffer. Each node
// cuts n elements into one range per local ordinal, at whole cache lines (its "cut"); the
// sorted union of every node's cut points splits [0, n) into pieces, and each piece has one
// holder per node, the local ordinal whose range contains it. A piece's holders are its
// group: the replicas, one per node, that exchange it over the network. Pure functions of the
// job's shape, so every replica computes the same pieces without talking.
//
//   const std::vector<size_t> cut = xs::detail::node_cut(n_elems, 3, sizeof(float));  // 4 offsets
//   for (const xs::detail::CutPiece& p : xs::detail::pieces_of(n_elems, 4, sizes, node, local))
//     exchange(p.offset, p.count, p.holders);

#include <cstddef>
#include <span>
#include <vector>

namespace xs::detail {

// node_size + 1 element offsets: bounds[l] = n_elems * l / node_size rounded up to a whole
// 64-byte cache line of elem_bytes elements (as chunk_elems rounds), at most n_elems;
// bounds[node_size] = n_elems. Ranges never share a cache line, the last ones may be short
// or empty. The rounding is monotone, so the cut points of different nodes keep the order of
// the fractions l / node_size, and nodes with equal sizes cut alike.
std::vector<size_t> node_cut(size_t n_elems, int node_size, size_t elem_bytes);

// The range of node_cut(n_elems, node_size, elem_bytes) that holds element `offset`
// (< n_elems): the last l whose bounds[l] <= offset.
int range_holding(size_t offset, size_t n_elems, int node_size, size_t elem_bytes);

struct CutPiece {
  size_t offset = 0;  // elements
  size_t count = 0;   // elements, never 0
  // holders[h]: the local ordinal of node h whose range holds the piece (gloo rank h of its
  // group).
  std::vector<int> holders;
};

// Every piece of [0, n_elems), in increasing offset order, cutting also at `extra_cuts`
// (element offsets in any order; those outside (0, n_elems) are ignored).
std::vector<CutPiece> all_pieces(size_t n_elems, size_t elem_bytes, std::span<const int> node_sizes,
                                 std::span<const size_t> extra_cuts = {});

// The pieces that replica (node, local_ordinal) handles, those whose holder on `node` is
// `local_ordinal` (they tile its range), in increasing offset order.
std::vector<CutPiece> pieces_of(size_t n_elems, size_t elem_bytes, std::span<const int> node_sizes,
                                int node, int local_ordinal,
                                std::span<const size_t> extra_cuts = {});

}  // namespace xs::detail
