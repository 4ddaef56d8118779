#include "xla_spawn/collectives/detail/stream_copy.h"

#include <emmintrin.h>

#include <cstdint>
#include <cstring>

namespace xs::detail {

void copy_out(void* dst, const void* src, size_t bytes, bool streaming) {
  if (!streaming || bytes < 256) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Head up to 16-byte alignment of the destination (streaming stores need it).
  const size_t head = (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16;
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, bytes - i);
  // Streaming stores are weakly ordered: fence before anyone is told the data is there.
  _mm_sfence();
}

}  // namespace xs::detail
