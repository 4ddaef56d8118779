#pragma once
// Copies into a replica's own buffer with non-temporal (streaming) stores when the data
// will not be read again before it leaves the cache: for large messages this skips the
// read-for-ownership of every destination line (a third of the memory traffic of a copy).
// glibc's memcpy never streams here because the L3 it sees is huge.
//
//   detail::copy_out(user + offset, staging + offset, bytes, /*streaming=*/bytes_total >= k);

#include <cstddef>

namespace xs::detail {

// Messages of at least this many bytes, times the world size, stream their user-buffer
// writes. Measured (CPU time per call, XLA_SPAWN_SPIN_US=0, two-shot): streaming cost 30-45%
// more at 2 MiB x N = 2 and N = 8, was mixed at 8-32 MiB x 2, and saved 5-15% at
// 32 MiB x 8; hence only for jobs moving at least 128 MiB in total.
inline constexpr size_t kStreamingMinTotalBytes = size_t{128} << 20;

void copy_out(void* dst, const void* src, size_t bytes, bool streaming);

}  // namespace xs::detail
