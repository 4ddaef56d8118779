#pragma once
// Whole-file reads and gzip decompression for the data and checkpoint readers. Both read a
// file once into memory (the largest input, Fashion-MNIST's training images, is 26 MB
// compressed, 47 MB raw), so parsing is a walk over a buffer with explicit bounds.
//
//   std::vector<uint8_t> raw = xs::detail::read_file_bytes(path, "idx file");
//   if (xs::detail::is_gzip(raw)) raw = xs::detail::gunzip(raw, path, kMaxBytes);

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xs::detail {

// Whose file a reader accepts.
enum class Owner : uint8_t {
  kAnyone,
  // This user's or root's, writable by neither group nor others, and not reached through
  // another user's symlink: what this user's own runs wrote (a checkpoint to resume), which
  // another local user must not be able to plant, rewrite or swap.
  kThisUser,
};

// The file's whole contents. Throws xs::IoError "<what> <path>: open: ..." on failure, and
// xs::InvalidArgument, without waiting or allocating, for what is not a regular file (a FIFO,
// a directory, a device), is larger than `max_bytes` (default: this machine's memory) or,
// with Owner::kThisUser, is not that.
std::vector<uint8_t> read_file_bytes(const std::string& path, std::string_view what,
                                     std::optional<size_t> max_bytes = std::nullopt,
                                     Owner owner = Owner::kAnyone);

// Physical memory of this machine in bytes (SIZE_MAX when the system cannot tell).
size_t physical_memory_bytes();

// True when `bytes` starts with the gzip magic 1f 8b.
bool is_gzip(std::span<const uint8_t> bytes);

// What gunzip does when the output reaches max_size_bytes.
enum class AtLimit : uint8_t {
  kThrow,  // reject the input (xs::InvalidArgument): it is larger than allowed
  kStop,   // return the first max_size_bytes bytes (a prefix, or a bounded read)
};

// Decompresses a gzip stream (one or more concatenated members). `source` names the input in
// errors; output is bounded by `max_size_bytes` (a hostile file cannot exhaust memory).
// Throws xs::InvalidArgument for corrupt, truncated or (with kThrow) oversized data.
std::vector<uint8_t> gunzip(std::span<const uint8_t> compressed, std::string_view source,
                            size_t max_size_bytes, AtLimit at_limit = AtLimit::kThrow);

}  // namespace xs::detail
