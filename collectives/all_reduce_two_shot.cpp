// Two-shot all-reduce: direct reduce-scatter then direct all-gather through the staging.
#include <algorithm>
#include <cstring>

#include "xla_spawn/collectives/detail/schedules.h"
#include "xla_spawn/collectives/detail/stream_copy.h"
#include "xla_spawn/collectives/reduce.h"

namespace xs::detail {

size_t chunk_elems(size_t slab_elems, int world_size, size_t elem_bytes) {
  const size_t line_elems = std::max<size_t>(1, shm::kCacheLineBytes / elem_bytes);
  const size_t per_ordinal = (slab_elems + world_size - 1) / world_size;
  return (per_ordinal + line_elems - 1) / line_elems * line_elems;
}

namespace {

// The part of a slab that belongs to chunk j: [offset, offset + count) elements.
struct Piece {
  size_t offset;
  size_t count;
};
Piece piece(size_t slab_count, size_t chunk, int j) {
  const size_t begin = std::min(slab_count, chunk * static_cast<size_t>(j));
  return {begin, std::min(slab_count, begin + chunk) - begin};
}

}  // namespace

// Two-shot schedule. The buffer is cut into slabs of at most one staging half, each slab
// into N chunks; ordinal j owns chunk j. Round k: every ordinal copies the chunks of slab k
// that others own into its staging half (its own chunk stays in its buffer); after sync()
// ordinal j reduces chunk j of slab k from all N ordinals in order 0..N-1, into its buffer
// and into its *other* staging half, where the next round publishes it; after the next
// sync() everyone copies the reduced chunks of slab k out of their owners' staging. So
// round k carries the inputs of slab k and the results of slab k - 1 (disjoint regions of
// one half), one sync per slab plus one to drain. Each ordinal reads each element about
// twice and writes it twice, whatever N: the bandwidth algorithm.
bool all_reduce_two_shot(Rounds& rounds, std::byte* data, size_t n_elems, DType dtype, ReduceOp op,
                         bool yield_to_arena) {
  const int n = rounds.world_size();
  const int me = rounds.ordinal();
  const size_t elem_bytes = dtype_size(dtype);
  // One chunk layout for every slab of the call, so the results of slab k - 1 and the
  // inputs of slab k, which share a staging half, sit in disjoint regions. Slabs are made
  // equal (the last one may be a little shorter) so that every ordinal reduces a fair share.
  const size_t line_elems = std::max<size_t>(1, shm::kCacheLineBytes / elem_bytes);
  const size_t capacity =
      static_cast<size_t>(n) * (rounds.half_bytes() / elem_bytes / n / line_elems * line_elems);
  const size_t n_slabs_wanted = std::max<size_t>(1, (n_elems + capacity - 1) / capacity);
  const size_t chunk = chunk_elems((n_elems + n_slabs_wanted - 1) / n_slabs_wanted, n, elem_bytes);
  const size_t slab_elems = chunk * static_cast<size_t>(n);
  const size_t n_slabs = n_elems == 0 ? 0 : (n_elems + slab_elems - 1) / slab_elems;
  std::vector<const void*>& sources = rounds.sources();
  const bool streaming = n_elems * elem_bytes * n >= kStreamingMinTotalBytes;
  size_t prev_offset = 0, prev_count = 0;
  for (size_t slab = 0; slab <= n_slabs; ++slab) {
    const size_t offset = slab * slab_elems;
    const size_t count = slab < n_slabs ? std::min(slab_elems, n_elems - offset) : 0;
    const int parity = rounds.next_parity();
    for (int j = 0; j < n; ++j) {
      const Piece p = piece(count, chunk, j);
      if (j == me || p.count == 0) continue;
      std::memcpy(rounds.staging(me, parity) + p.offset * elem_bytes,
                  data + (offset + p.offset) * elem_bytes, p.count * elem_bytes);
    }
    rounds.sync();
    if (slab == 0 && yield_to_arena && rounds.any_in_arena(parity)) return false;
    for (int j = 0; j < n; ++j) {  // results of the previous slab, published by this round
      const Piece p = piece(prev_count, chunk, j);
      if (j == me || p.count == 0) continue;
      copy_out(data + (prev_offset + p.offset) * elem_bytes,
               rounds.staging(j, parity) + p.offset * elem_bytes, p.count * elem_bytes, streaming);
    }
    const Piece own = piece(count, chunk, me);
    std::byte* own_data = data + (offset + own.offset) * elem_bytes;
    for (int j = 0; j < n; ++j) {
      sources[j] = j == me ? own_data : rounds.staging(j, parity) + own.offset * elem_bytes;
    }
    reduce_sources(own_data, rounds.staging(me, 1 - parity) + own.offset * elem_bytes,
                   sources.data(), n, own.count, dtype, op, n, streaming);
    prev_offset = offset;
    prev_count = count;
  }
  return true;
}

}  // namespace xs::detail
