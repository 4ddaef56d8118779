// All-gather through every ordinal's staging.
#include <algorithm>
#include <cstring>

#include "xla_spawn/collectives/detail/schedules.h"

namespace xs::detail {

// All-gather schedule. Each ordinal's input is cut into slabs of one staging half; for
// each slab every ordinal copies its piece into its staging, one sync() publishes all of
// them, and every ordinal copies all N pieces into its output at (ordinal * n_bytes + slab
// offset). Its own piece is copied straight from its input.
void all_gather(Rounds& rounds, const std::byte* in, std::byte* out, size_t n_bytes) {
  const int n = rounds.world_size();
  const int me = rounds.ordinal();
  const size_t slab_bytes = rounds.half_bytes();
  size_t done = 0;
  do {
    const size_t bytes = std::min(slab_bytes, n_bytes - done);
    const int parity = rounds.next_parity();
    if (bytes != 0) std::memcpy(rounds.staging(me, parity), in + done, bytes);
    rounds.sync();
    for (int j = 0; j < n && bytes != 0; ++j) {
      const std::byte* from = j == me ? in + done : rounds.staging(j, parity);
      std::memmove(out + static_cast<size_t>(j) * n_bytes + done, from, bytes);
    }
    done += bytes;
  } while (done < n_bytes);
}

}  // namespace xs::detail
