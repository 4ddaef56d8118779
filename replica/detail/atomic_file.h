#pragma once
// Replacing a file atomically: write a temporary file in the same directory (owner-only,
// 0600), fsync it, rename it over the target, fsync the directory. A reader sees the old
// file or the new one, never a mix; a crash or error before the rename leaves the old file.
//
//   xs::detail::AtomicFileWriter out(path, "checkpoint");
//   out.write(bytes);
//   out.commit();            // without commit(), the destructor removes the temporary

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xs::detail {

class AtomicFileWriter {
 public:
  // Creates "<dir>/.<name>.tmp.<pid>.XXXXXX". Throws xs::IoError naming `what` and the path,
  // and xs::InvalidArgument when the path names a directory, a device, a FIFO or a socket
  // (directly or through symlinks), lies in /dev or /proc, or its directory is reached through
  // another user's symlink.
  AtomicFileWriter(std::string path, std::string_view what);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(std::span<const uint8_t> bytes);  // buffered
  void write_zeros(size_t n_bytes);
  // Flushes, fsyncs, renames over the target and fsyncs the directory.
  void commit();

  const std::string& temp_path() const { return temp_path_; }
  uint64_t size_bytes() const { return written_ + buffer_.size(); }

 private:
  void flush();
  [[noreturn]] void fail(std::string_view step, int errno_value);

  std::string path_;
  std::string what_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
  uint64_t written_ = 0;
  std::vector<uint8_t> buffer_;
};

// True when `path` names, through symlinks, a FIFO, a character device, or anything in /dev
// or /proc (/dev/stdout onto a file, /proc/self/fd/N): a stream a user gave for an output that
// may go to one (/dev/stdout, a shell's >(gzip > f)), written with write_to_stream instead of
// replaced. Throws xs::InvalidArgument naming `what` when the path goes through another
// user's symlink (which could point it at any device) or names another user's FIFO.
bool names_a_stream(const std::string& path, std::string_view what);
// Opens the stream at `path` for appending and writes `bytes`; a FIFO's reader gets
// kStreamReaderWaitMs to appear, and as long between two writes it takes. A reader that went
// away is an error, not a SIGPIPE. Throws xs::IoError naming `what` and the path.
inline constexpr int kStreamReaderWaitMs = 30'000;
void write_to_stream(const std::string& path, std::string_view what, std::string_view bytes);

// Removes temporaries of `path` left by writers that no longer run (killed mid-write).
// Returns how many were removed; errors are ignored (it is housekeeping).
int remove_stale_temps(const std::string& path);

}  // namespace xs::detail
