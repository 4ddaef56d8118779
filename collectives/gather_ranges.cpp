// Gather of uneven ranges through every ordinal's staging.
#include <algorithm>
#include <cstring>

#include "xla_spawn/collectives/detail/schedules.h"

namespace xs::detail {

// Gather-ranges schedule. Ordinal k owns range k ([bounds[k], bounds[k + 1]) elements). Each
// range is cut into slabs of one staging half, counted from the range's start; in round s
// every ordinal copies slab s of its range (if it has one) into its staging, one sync()
// publishes them, and every ordinal copies each peer's slab s to the same offset of its own
// buffer. As many rounds as the longest range has slabs, at least one; every ordinal holds
// the same bounds (the call header carries their digest), so all count the same rounds.
void gather_ranges(Rounds& rounds, std::byte* data, size_t elem_bytes,
                   std::span<const size_t> bounds) {
  const int n = rounds.world_size();
  const int me = rounds.ordinal();
  const size_t slab_bytes = rounds.half_bytes();
  size_t longest_bytes = 0;
  for (int j = 0; j < n; ++j) {
    longest_bytes = std::max(longest_bytes, (bounds[j + 1] - bounds[j]) * elem_bytes);
  }
  size_t done = 0;  // bytes of each range moved so far
  do {
    const int parity = rounds.next_parity();
    auto slab = [&](int j) {  // bytes of range j in this round
      const size_t range_bytes = (bounds[j + 1] - bounds[j]) * elem_bytes;
      return std::min(slab_bytes, range_bytes - std::min(range_bytes, done));
    };
    if (const size_t bytes = slab(me); bytes != 0) {
      std::memcpy(rounds.staging(me, parity), data + bounds[me] * elem_bytes + done, bytes);
    }
    rounds.sync();
    for (int j = 0; j < n; ++j) {
      const size_t bytes = slab(j);
      if (j == me || bytes == 0) continue;
      std::memcpy(data + bounds[j] * elem_bytes + done, rounds.staging(j, parity), bytes);
    }
    done += slab_bytes;
  } while (done < longest_bytes);
}

}  // namespace xs::detail
