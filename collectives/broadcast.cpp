// Broadcast from a root ordinal through its staging.
#include <algorithm>
#include <cstring>

#include "xla_spawn/collectives/detail/schedules.h"

namespace xs::detail {

// Broadcast schedule. The root copies slab after slab (one staging half each, alternating
// halves) into its staging; after each sync() every other ordinal copies the slab out.
// The alternating halves let the root fill slab k + 1 while others still read slab k.
void broadcast(Rounds& rounds, std::byte* data, size_t n_bytes, int root) {
  const bool is_root = rounds.ordinal() == root;
  const size_t slab_bytes = rounds.half_bytes();
  size_t done = 0;
  do {
    const size_t bytes = std::min(slab_bytes, n_bytes - done);
    const int parity = rounds.next_parity();
    if (is_root && bytes != 0) std::memcpy(rounds.staging(root, parity), data + done, bytes);
    rounds.sync();
    if (!is_root && bytes != 0) std::memcpy(data + done, rounds.staging(root, parity), bytes);
    done += bytes;
  } while (done < n_bytes);
}

}  // namespace xs::detail
