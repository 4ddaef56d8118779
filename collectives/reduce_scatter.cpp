// Reduce-scatter through every ordinal's staging.
#include <algorithm>
#include <cstring>

#include "xla_spawn/collectives/detail/schedules.h"
#include "xla_spawn/collectives/reduce.h"

namespace xs::detail {

// Reduce-scatter schedule. The input holds N chunks of n_elems; ordinal j's output is the
// reduction of chunk j over all ordinals. The chunks are cut into slabs so that N slab
// pieces fit one staging half; per slab, every ordinal copies the pieces of the chunks that
// others own into its staging (piece j at j * piece size), one sync() publishes them, and
// every ordinal reduces its own chunk's piece from all N ordinals in order 0..N-1.
void reduce_scatter(Rounds& rounds, const std::byte* in, std::byte* out, size_t n_elems,
                    DType dtype, ReduceOp op) {
  const int n = rounds.world_size();
  const int me = rounds.ordinal();
  const size_t elem_bytes = dtype_size(dtype);
  const size_t piece_elems = std::max<size_t>(1, rounds.half_bytes() / elem_bytes / n);
  const size_t piece_bytes = piece_elems * elem_bytes;
  std::vector<const void*>& sources = rounds.sources();
  size_t done = 0;
  do {
    const size_t count = std::min(piece_elems, n_elems - done);
    const int parity = rounds.next_parity();
    for (int j = 0; j < n && count != 0; ++j) {
      if (j == me) continue;
      std::memcpy(rounds.staging(me, parity) + j * piece_bytes,
                  in + (j * n_elems + done) * elem_bytes, count * elem_bytes);
    }
    rounds.sync();
    for (int j = 0; j < n; ++j) {
      sources[j] = j == me ? in + (me * n_elems + done) * elem_bytes
                           : rounds.staging(j, parity) + me * piece_bytes;
    }
    reduce_sources(out + done * elem_bytes, nullptr, sources.data(), n, count, dtype, op, n);
    done += count;
  } while (done < n_elems);
}

}  // namespace xs::detail
