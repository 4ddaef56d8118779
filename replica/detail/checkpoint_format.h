#pragma once
// The checkpoint file layout, version 1. All integers little-endian.
//
//   0   magic "XSCKPT\r\n" (8 bytes; \r\n catches text-mode mangling)
//   8   u32 version
//   12  u32 flags (0; reserved)
//   16  u64 file size in bytes (checksum included): truncation is named before anything else
//   24  u64 index end: the byte after the last index entry
//   32  u32 tensor count
//   36  u32 metadata count
//   40  index: per tensor  u32 name length, name, u8 dtype, u8 rank, rank x i64 dim,
//                          u64 data offset, u64 data size in bytes
//              per entry   u32 key length, key, u8 kind (1 = i64, 2 = string),
//                          i64 value | u32 length + bytes
//   ... tensor data, each starting at a multiple of 64 bytes, zero padding between
//   end-4  u32 CRC-32 (zlib) of every byte before it

#include <array>
#include <cstddef>
#include <cstdint>

namespace xs::detail::ckpt {

inline constexpr std::array<uint8_t, 8> kMagic = {'X', 'S', 'C', 'K', 'P', 'T', '\r', '\n'};
inline constexpr uint32_t kVersion = 1;
inline constexpr size_t kFixedHeaderBytes = 40;
inline constexpr size_t kChecksumBytes = 4;
inline constexpr size_t kDataAlignment = 64;  // cache line; lets a reader map tensors aligned
inline constexpr uint8_t kMetaInt = 1;
inline constexpr uint8_t kMetaString = 2;

}  // namespace xs::detail::ckpt
