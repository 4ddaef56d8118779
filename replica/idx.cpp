#include "xla_spawn/replica/idx.h"

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/detail/file_bytes.h"

namespace xs {
namespace {

bool known_type(uint8_t byte) {
  switch (static_cast<IdxType>(byte)) {
    case IdxType::kU8:
    case IdxType::kI8:
    case IdxType::kI16:
    case IdxType::kI32:
    case IdxType::kF32:
    case IdxType::kF64:
      return true;
  }
  return false;
}

uint32_t read_be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

// Product of dims times elem_size, or nullopt-like UINT64_MAX when it exceeds `limit`.
uint64_t data_size_or_max(const std::vector<uint64_t>& dims, size_t elem_size, uint64_t limit) {
  uint64_t total = elem_size;
  for (uint64_t d : dims) {
    if (d != 0 && total > limit / d) return UINT64_MAX;
    total *= d;
  }
  return total;
}

}  // namespace

std::string_view idx_type_name(IdxType type) {
  switch (type) {
    case IdxType::kU8:
      return "u8";
    case IdxType::kI8:
      return "i8";
    case IdxType::kI16:
      return "i16";
    case IdxType::kI32:
      return "i32";
    case IdxType::kF32:
      return "f32";
    case IdxType::kF64:
      return "f64";
  }
  return "?";
}

size_t idx_type_size(IdxType type) {
  switch (type) {
    case IdxType::kU8:
      return 1;
    case IdxType::kI8:
      return 1;
    case IdxType::kI16:
      return 2;
    case IdxType::kI32:
      return 4;
    case IdxType::kF32:
      return 4;
    case IdxType::kF64:
      return 8;
  }
  return 0;
}

uint64_t IdxArray::n_elems() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;  // parse_idx proved this fits the file
  return n;
}

std::string IdxArray::shape_string() const {
  return fmt::format("{}", fmt::join(dims, "x"));
}

namespace {

// Validates the magic and dimensions in `bytes` (the file, or at least its first
// kMaxIdxHeaderBytes) and returns the array without its elements, plus their size in bytes.
IdxArray parse_header(std::span<const uint8_t> bytes, std::string_view source,
                      size_t max_size_bytes, uint64_t& data_bytes) {
  const size_t size = bytes.size();
  if (size < 4) {
    throw InvalidArgument(
        fmt::format("idx file {}: {} bytes, too short for the 4-byte IDX magic", source, size));
  }
  if (bytes[0] != 0 || bytes[1] != 0) {
    throw InvalidArgument(fmt::format(
        "idx file {}: bad magic {:02x} {:02x} {:02x} {:02x}: an IDX file starts with 00 00 "
        "<type> <rank>",
        source, bytes[0], bytes[1], bytes[2], bytes[3]));
  }
  if (!known_type(bytes[2])) {
    throw InvalidArgument(fmt::format(
        "idx file {}: unknown element type byte 0x{:02x} in the magic (expected 08 u8, 09 i8, "
        "0b i16, 0c i32, 0d f32 or 0e f64)",
        source, bytes[2]));
  }
  const int rank = bytes[3];
  if (rank < 1 || rank > kMaxIdxRank) {
    throw InvalidArgument(fmt::format("idx file {}: rank {} in the magic, expected 1..{}", source,
                                      rank, kMaxIdxRank));
  }
  IdxArray array;
  array.type = static_cast<IdxType>(bytes[2]);
  array.data_offset = 4 + 4 * static_cast<size_t>(rank);
  if (size < array.data_offset) {
    throw InvalidArgument(fmt::format(
        "idx file {}: {} bytes, too short for the header of rank {} ({} bytes): truncated", source,
        size, rank, array.data_offset));
  }
  for (int i = 0; i < rank; ++i) array.dims.push_back(read_be32(&bytes[4 + 4 * i]));
  data_bytes = data_size_or_max(array.dims, idx_type_size(array.type), max_size_bytes);
  if (data_bytes == UINT64_MAX) {
    throw InvalidArgument(fmt::format("idx file {}: dims {} of {} exceed the {}-byte limit", source,
                                      fmt::join(array.dims, "x"), idx_type_name(array.type),
                                      max_size_bytes));
  }
  return array;
}

}  // namespace

IdxArray parse_idx(std::vector<uint8_t> bytes, std::string_view source, size_t max_size_bytes) {
  uint64_t need = 0;
  IdxArray array = parse_header(bytes, source, max_size_bytes, need);
  const size_t have = bytes.size() - array.data_offset;
  if (need != have) {
    throw InvalidArgument(fmt::format(
        "idx file {}: dims {} of {} need {} data bytes but the file has {} after the {}-byte "
        "header ({})",
        source, fmt::join(array.dims, "x"), idx_type_name(array.type), need, have,
        array.data_offset, need > have ? "truncated" : "trailing bytes"));
  }
  array.bytes = std::move(bytes);
  return array;
}

IdxArray decode_idx(std::vector<uint8_t> file_bytes, std::string_view source,
                    size_t max_size_bytes) {
  if (!detail::is_gzip(file_bytes)) return parse_idx(std::move(file_bytes), source, max_size_bytes);
  // Inflate the header first and then only the size it declares (+1 to see trailing bytes):
  // a bad or hostile file is rejected without inflating more than it claims to hold.
  const std::string gz_source = fmt::format("idx file {}", source);
  constexpr size_t kMaxHeaderBytes = 4 + 4 * kMaxIdxRank;
  const auto prefix =
      detail::gunzip(file_bytes, gz_source, kMaxHeaderBytes, detail::AtLimit::kStop);
  uint64_t need = 0;
  const IdxArray header = parse_header(prefix, source, max_size_bytes, need);
  const size_t declared = header.data_offset + need;
  return parse_idx(detail::gunzip(file_bytes, gz_source, declared + 1, detail::AtLimit::kStop),
                   source, max_size_bytes);
}

IdxArray read_idx(const std::string& path, size_t max_size_bytes) {
  return decode_idx(detail::read_file_bytes(path, "idx file"), path, max_size_bytes);
}

}  // namespace xs
