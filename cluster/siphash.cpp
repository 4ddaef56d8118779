#include "xla_spawn/cluster/siphash.h"

#include <cstring>

namespace xs::cluster {
namespace {

constexpr uint64_t rotl(uint64_t x, int b) {
  return (x << b) | (x >> (64 - b));
}

// One SipRound on the state v0..v3.
void sip_round(uint64_t& v0, uint64_t& v1, uint64_t& v2, uint64_t& v3) {
  v0 += v1;
  v1 = rotl(v1, 13);
  v1 ^= v0;
  v0 = rotl(v0, 32);
  v2 += v3;
  v3 = rotl(v3, 16);
  v3 ^= v2;
  v0 += v3;
  v3 = rotl(v3, 21);
  v3 ^= v0;
  v2 += v1;
  v1 = rotl(v1, 17);
  v1 ^= v2;
  v2 = rotl(v2, 32);
}

uint64_t load_le64(const unsigned char* p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = (x << 8) | p[i];
  return x;
}

}  // namespace

uint64_t siphash24(const SipKey& key, const void* data, size_t n_bytes) {
  // The constants are "somepseudorandomlygeneratedbytes" in ASCII (the paper's initial state).
  uint64_t v0 = key.k0 ^ 0x736f6d6570736575ULL;
  uint64_t v1 = key.k1 ^ 0x646f72616e646f6dULL;
  uint64_t v2 = key.k0 ^ 0x6c7967656e657261ULL;
  uint64_t v3 = key.k1 ^ 0x7465646279746573ULL;
  const auto* in = static_cast<const unsigned char*>(data);
  const size_t whole = n_bytes - n_bytes % 8;
  for (size_t i = 0; i < whole; i += 8) {
    const uint64_t m = load_le64(in + i);
    v3 ^= m;
    sip_round(v0, v1, v2, v3);
    sip_round(v0, v1, v2, v3);
    v0 ^= m;
  }
  // The last block: the remaining bytes, and the message length mod 256 in the top byte.
  unsigned char last[8] = {};
  std::memcpy(last, in + whole, n_bytes - whole);
  const uint64_t b = load_le64(last) | (static_cast<uint64_t>(n_bytes & 0xff) << 56);
  v3 ^= b;
  sip_round(v0, v1, v2, v3);
  sip_round(v0, v1, v2, v3);
  v0 ^= b;
  v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) sip_round(v0, v1, v2, v3);
  return v0 ^ v1 ^ v2 ^ v3;
}

}  // namespace xs::cluster
