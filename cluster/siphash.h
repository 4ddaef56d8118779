#pragma once
// SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed 64-bit hash designed as a MAC for short
// messages. The rendezvous protocol uses it to prove knowledge of the job token without
// sending it (cluster/job_token.h); it is not used for anything that needs collision
// resistance without a key.
//
//   const xs::cluster::SipKey key{0x0706050403020100, 0x0f0e0d0c0b0a0908};
//   uint64_t tag = xs::cluster::siphash24(key, bytes.data(), bytes.size());

#include <cstddef>
#include <cstdint>

namespace xs::cluster {

// The 128-bit key as two little-endian 64-bit words (k0 = key bytes 0..7).
struct SipKey {
  uint64_t k0 = 0;
  uint64_t k1 = 0;
};

uint64_t siphash24(const SipKey& key, const void* data, size_t n_bytes);

}  // namespace xs::cluster
