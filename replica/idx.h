#pragma once
// Reader for IDX files, the MNIST family's format: magic 00 00 <type> <rank>, then <rank>
// big-endian u32 dimensions, then the elements (big-endian), gzip-compressed or raw. Every
// field is validated against the bytes actually present; errors name the file and the field.
//
//   xs::IdxArray images =
//   xs::read_idx("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz");
//   // images.dims == {10000, 28, 28}, images.type == xs::IdxType::kU8, images.data().size() ==
//   7840000

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xs {

// The element type byte of the IDX magic.
enum class IdxType : uint8_t {
  kU8 = 0x08,
  kI8 = 0x09,
  kI16 = 0x0B,
  kI32 = 0x0C,
  kF32 = 0x0D,
  kF64 = 0x0E
};

std::string_view idx_type_name(IdxType type);
size_t idx_type_size(IdxType type);

// Rank above this is rejected: MNIST-style files have 1 (labels) or 3 (images).
inline constexpr int kMaxIdxRank = 8;
// Default cap on the decompressed size of one file (hostile input cannot exhaust memory).
inline constexpr size_t kDefaultMaxIdxBytes = size_t{2} << 30;

struct IdxArray {
  IdxType type = IdxType::kU8;
  std::vector<uint64_t> dims;
  std::vector<uint8_t> bytes;  // the whole decompressed file; elements start at data_offset
  size_t data_offset = 0;

  uint64_t n_elems() const;
  // The elements in file order; multi-byte types stay big-endian as stored.
  std::span<const uint8_t> data() const {
    return std::span<const uint8_t>(bytes).subspan(data_offset);
  }
  std::string shape_string() const;  // "60000x28x28"
};

// Parses decompressed IDX bytes (taking ownership). `source` names the input in errors.
// Throws xs::InvalidArgument on a bad magic, type, rank, or size mismatch.
IdxArray parse_idx(std::vector<uint8_t> bytes, std::string_view source,
                   size_t max_size_bytes = kDefaultMaxIdxBytes);

// Decompresses `file_bytes` if they are gzip (detected from the content) and parses them:
// what read_idx does after reading the file, and what the fuzz target calls.
IdxArray decode_idx(std::vector<uint8_t> file_bytes, std::string_view source,
                    size_t max_size_bytes = kDefaultMaxIdxBytes);

// Reads `path` (gzip or raw, detected from the content) and parses it. Throws xs::IoError when
// the file cannot be read, xs::InvalidArgument when its contents are wrong.
IdxArray read_idx(const std::string& path, size_t max_size_bytes = kDefaultMaxIdxBytes);

}  // namespace xs
