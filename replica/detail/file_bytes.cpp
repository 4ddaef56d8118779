#include "xla_spawn/replica/detail/file_bytes.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>
#include <zlib.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/base/io.h"

namespace xs::detail {
namespace {

// Closes a file descriptor on scope exit.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// deflate expands at most about 1032:1 (zlib's FAQ); no honest stream decompresses to more.
constexpr size_t kMaxDeflateRatio = 1032;

// gzip stores the uncompressed size mod 2^32 in its last 4 bytes (RFC 1952, ISIZE): a hint
// for the first allocation only, never trusted as a bound. A truncated or hostile file's
// "ISIZE" is arbitrary, so the hint is also capped by what the input could expand to.
size_t initial_capacity(std::span<const uint8_t> compressed, size_t max_size_bytes) {
  if (compressed.size() < 4) return 0;
  const uint8_t* p = compressed.data() + compressed.size() - 4;
  const size_t isize = size_t{p[0]} | size_t{p[1]} << 8 | size_t{p[2]} << 16 | size_t{p[3]} << 24;
  return std::min({isize, max_size_bytes, compressed.size() * kMaxDeflateRatio});
}

// Inflate's counters are 32-bit; feed at most this much per call.
constexpr size_t kMaxZlibChunk = size_t{1} << 30;

}  // namespace

size_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return SIZE_MAX;
  return static_cast<size_t>(pages) * static_cast<size_t>(page);
}

std::vector<uint8_t> read_file_bytes(const std::string& path, std::string_view what,
                                     std::optional<size_t> max_bytes, Owner owner) {
  if (owner == Owner::kThisUser) {
    if (const std::string link = foreign_symlink(path); !link.empty()) {
      throw InvalidArgument(fmt::format(
          "{} {}: reached through {}, whose owner could point it at any file; give its real path "
          "if you trust them",
          what, path, link));
    }
  }
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer for ever; the
  // type is checked right after, and a regular file's reads ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw IoError(errno_message(fmt::format("{} {}: open", what, path), errno));
  FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw IoError(errno_message(fmt::format("{} {}: fstat", what, path), errno));
  }
  if (!S_ISREG(st.st_mode)) {
    throw InvalidArgument(fmt::format("{} {}: not a regular file", what, path));
  }
  if (owner == Owner::kThisUser && st.st_uid != ::geteuid() && st.st_uid != 0) {
    throw InvalidArgument(fmt::format(
        "{} {}: belongs to uid {}, not this user (uid {}): another user could have planted it; "
        "copy it to a file of your own if you trust it",
        what, path, st.st_uid, ::geteuid()));
  }
  if (owner == Owner::kThisUser && (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    // The group bits are an ACL's mask when the file has one: a writer named there shows.
    throw InvalidArgument(fmt::format(
        "{} {}: group or others may write it (mode {:04o}); chmod go-w it if you trust its "
        "contents",
        what, path, st.st_mode & 07777));
  }
  const size_t limit = max_bytes.value_or(physical_memory_bytes());
  if (static_cast<uint64_t>(st.st_size) > limit) {
    throw InvalidArgument(fmt::format("{} {}: {} bytes, more than the {} bytes it may have{}", what,
                                      path, st.st_size, limit,
                                      max_bytes ? "" : " (this machine's memory)"));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(errno_message(fmt::format("{} {}: read", what, path), errno));
    if (n == 0) {
      throw IoError(fmt::format("{} {}: file shrank while reading: {} of {} bytes", what, path,
                                done, bytes.size()));
    }
    done += static_cast<size_t>(n);
  }
  return bytes;
}

bool is_gzip(std::span<const uint8_t> bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

std::vector<uint8_t> gunzip(std::span<const uint8_t> compressed, std::string_view source,
                            size_t max_size_bytes, AtLimit at_limit) {
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {  // 16+: expect a gzip wrapper
    throw InternalError(fmt::format("{}: inflateInit2 failed", source));
  }
  std::vector<uint8_t> out(initial_capacity(compressed, max_size_bytes));
  size_t in_pos = 0;
  size_t out_pos = 0;
  int rc = Z_OK;
  for (;;) {
    if (out_pos == out.size()) {
      if (out.size() >= max_size_bytes && at_limit == AtLimit::kStop) break;
      if (out.size() >= max_size_bytes) {
        inflateEnd(&zs);
        throw InvalidArgument(
            fmt::format("{}: decompresses to more than {} bytes (limit)", source, max_size_bytes));
      }
      out.resize(std::min(max_size_bytes, std::max<size_t>(out.size() * 2, 1 << 16)));
    }
    zs.next_in = const_cast<Bytef*>(compressed.data() + in_pos);
    zs.avail_in = static_cast<uInt>(std::min(compressed.size() - in_pos, kMaxZlibChunk));
    zs.next_out = out.data() + out_pos;
    zs.avail_out = static_cast<uInt>(std::min(out.size() - out_pos, kMaxZlibChunk));
    const uInt avail_in_before = zs.avail_in;
    const uInt avail_out_before = zs.avail_out;
    rc = inflate(&zs, Z_NO_FLUSH);
    in_pos += avail_in_before - zs.avail_in;
    out_pos += avail_out_before - zs.avail_out;
    if (rc == Z_STREAM_END) {
      // Another gzip member may follow (`cat a.gz b.gz` is a valid gzip file).
      if (in_pos == compressed.size()) break;
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_out == 0) continue;  // output full: grow and go on
    const std::string zmsg = zs.msg != nullptr ? zs.msg : "no detail";
    inflateEnd(&zs);
    if (rc == Z_BUF_ERROR) {
      throw InvalidArgument(fmt::format(
          "{}: gzip data ends early after {} compressed bytes ({} decompressed): truncated", source,
          in_pos, out_pos));
    }
    throw InvalidArgument(fmt::format("{}: corrupt gzip data at compressed byte {}: {} (zlib {})",
                                      source, in_pos, zmsg, rc));
  }
  inflateEnd(&zs);
  out.resize(out_pos);
  return out;
}

}  // namespace xs::detail
