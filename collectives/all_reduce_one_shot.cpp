// One-shot all-reduce: for small messages, where latency is all that matters.
#include <algorithm>
#include <cstring>

#include "xla_spawn/collectives/detail/schedules.h"
#include "xla_spawn/collectives/reduce.h"

namespace xs::detail {

// One-shot schedule. The buffer is cut into slabs of at most one staging half. For each
// slab, every ordinal copies its input into its own staging half (a slab of at most
// kInlineBytes rides in the ordinal's mailbox cache line instead, next to the round word),
// one sync() makes all N copies visible, and every ordinal reduces the N copies itself, in
// ordinal order 0..N-1, into its buffer (its own copy is read from the buffer). One sync
// per slab and no chain of dependent hops, so it has the lowest latency; the price is N
// reads per element on every ordinal, which loses to the two-shot as messages grow.
bool all_reduce_one_shot(Rounds& rounds, std::byte* data, size_t n_elems, DType dtype, ReduceOp op,
                         bool yield_to_arena) {
  const int n = rounds.world_size();
  const int me = rounds.ordinal();
  const size_t elem_bytes = dtype_size(dtype);
  const size_t slab_elems = rounds.half_bytes() / elem_bytes;
  std::vector<const void*>& sources = rounds.sources();
  size_t done = 0;
  do {
    const size_t count = std::min(slab_elems, n_elems - done);
    const size_t bytes = count * elem_bytes;
    std::byte* mine = data + done * elem_bytes;
    const int parity = rounds.next_parity();
    const bool in_mailbox = bytes <= shm::kInlineBytes;
    auto area = [&](int j) {
      return in_mailbox ? rounds.inline_data(j, parity) : rounds.staging(j, parity);
    };
    if (bytes != 0) std::memcpy(area(me), mine, bytes);
    rounds.sync();
    if (done == 0 && yield_to_arena && rounds.any_in_arena(parity)) return false;
    for (int j = 0; j < n; ++j) sources[j] = j == me ? mine : area(j);
    reduce_sources(mine, nullptr, sources.data(), n, count, dtype, op, n);
    done += count;
  } while (done < n_elems);
  return true;
}

}  // namespace xs::detail
