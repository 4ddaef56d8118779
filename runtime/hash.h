#pragma once
// 64-bit hash combining for IR nodes and graphs. Not cryptographic: a collision between two
// different graphs would reuse the wrong program, so the mix is strong (splitmix64 finaliser)
// and a program checks its input count and sizes on every run.
//
//   uint64_t h = hash_combine(hash_combine(kSeed, op), operand_hash);

#include <cstdint>
#include <cstring>

namespace xs {

inline constexpr uint64_t kHashSeed = 0x6a09e667f3bcc909ull;  // sqrt(2) fraction bits (SHA-2)

inline uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t hash_combine(uint64_t h, uint64_t v) { return mix64(h ^ mix64(v)); }

inline uint64_t hash_double(uint64_t h, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return hash_combine(h, bits);
}

}  // namespace xs
