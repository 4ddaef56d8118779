// Direct (zero-copy) reduce-scatter and all-gather: like the direct all-reduce, over inputs
// in the replicas' buffer arenas, which every process maps, so each ordinal reads its
// peers' inputs in place. Together they move the same bytes as the direct all-reduce,
// which is what a sharded optimizer update (reduce-scatter, update one chunk, all-gather)
// relies on.
#include <algorithm>
#include <cstring>

#include "xla_spawn/collectives/detail/schedules.h"
#include "xla_spawn/collectives/reduce.h"

namespace xs::detail {

// Ordinal j reduces chunk j (n_elems at j * n_elems) of every input, in ordinal order
// 0..N-1 (the order and arithmetic of all_reduce_direct, so the bits are the same), into
// `out`; a final sync keeps every input unchanged until all owners have read it.
void reduce_scatter_direct(Rounds& rounds, int parity, const std::byte* in, std::byte* out,
                           size_t n_elems, DType dtype, ReduceOp op) {
  const int n = rounds.world_size();
  const size_t elem_bytes = dtype_size(dtype);
  const std::vector<std::byte*> inputs = published_arena_operands(
      rounds, parity, const_cast<std::byte*>(in), n_elems * static_cast<size_t>(n) * elem_bytes);
  const size_t base = n_elems * static_cast<size_t>(rounds.ordinal()) * elem_bytes;
  const size_t step = direct_block_elems(n, elem_bytes);
  std::vector<const void*>& sources = rounds.sources();
  for (size_t offset = 0; offset < n_elems; offset += step) {
    const size_t count = std::min(step, n_elems - offset);
    const size_t at = offset * elem_bytes;
    for (int j = 0; j < n; ++j) sources[j] = inputs[j] + base + at;
    reduce_sources(out + at, nullptr, sources.data(), n, count, dtype, op, n);
  }
  rounds.sync();
}

// Every ordinal copies every input (n_bytes each, gathered at ordinal * n_bytes) into the
// pieces that cover it; a final sync keeps the inputs unchanged until all have been read.
void all_gather_direct(Rounds& rounds, int parity, const std::byte* in,
                       std::span<const GatherPiece> out, size_t n_bytes) {
  const std::vector<std::byte*> inputs =
      published_arena_operands(rounds, parity, const_cast<std::byte*>(in), n_bytes);
  for (int j = 0; j < rounds.world_size(); ++j)
    copy_to_pieces(out, static_cast<size_t>(j) * n_bytes, inputs[j], n_bytes);
  rounds.sync();
}

}  // namespace xs::detail
