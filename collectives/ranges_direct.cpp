// Direct (zero-copy) range phases: like the direct reduce-scatter and all-gather, over
// operands in the replicas' buffer arenas, but each ordinal owns the range of the buffer that
// the caller's bounds give it rather than an equal chunk. The hierarchical collectives
// (multi_host_communicator.h) cut a node's buffer this way: each range is then exchanged with
// other nodes by the replica that owns it.
#include <algorithm>
#include <cstring>

#include "xla_spawn/collectives/detail/schedules.h"
#include "xla_spawn/collectives/reduce.h"

namespace xs::detail {

// Ordinal k reduces its range of every operand, in ordinal order 0..N-1 (the order and
// arithmetic of all_reduce_direct, so the bits are the same), into its own operand, block by
// block out of the peers' arenas. Ranges are disjoint and each ordinal writes only its own
// range of its own operand, which no one else reads; a final sync keeps every operand
// unchanged until all owners have read it.
void reduce_ranges_direct(Rounds& rounds, int parity, std::byte* data, DType dtype, ReduceOp op,
                          std::span<const size_t> bounds) {
  const int n = rounds.world_size();
  const int me = rounds.ordinal();
  const size_t elem_bytes = dtype_size(dtype);
  const std::vector<std::byte*> operands =
      published_arena_operands(rounds, parity, data, bounds.back() * elem_bytes);
  const size_t block_elems = direct_block_elems(n, elem_bytes);
  std::vector<const void*>& sources = rounds.sources();
  for (size_t offset = bounds[me]; offset < bounds[me + 1]; offset += block_elems) {
    const size_t count = std::min(block_elems, bounds[me + 1] - offset);
    const size_t at = offset * elem_bytes;
    for (int j = 0; j < n; ++j) sources[j] = operands[j] + at;
    reduce_sources(data + at, nullptr, sources.data(), n, count, dtype, op, n);
  }
  rounds.sync();
}

// Every ordinal copies range j of ordinal j's operand into its own, for every peer j. Ordinal
// j never writes its own range here, so the copies read stable bytes; a final sync keeps
// every operand unchanged until all have been read.
void gather_ranges_direct(Rounds& rounds, int parity, std::byte* data, size_t elem_bytes,
                          std::span<const size_t> bounds) {
  const std::vector<std::byte*> operands =
      published_arena_operands(rounds, parity, data, bounds.back() * elem_bytes);
  for (int j = 0; j < rounds.world_size(); ++j) {
    if (j == rounds.ordinal() || bounds[j] == bounds[j + 1]) continue;
    const size_t at = bounds[j] * elem_bytes;
    std::memcpy(data + at, operands[j] + at, (bounds[j + 1] - bounds[j]) * elem_bytes);
  }
  rounds.sync();
}

}  // namespace xs::detail
