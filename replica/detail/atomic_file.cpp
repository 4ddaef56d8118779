#include "xla_spawn/replica/detail/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <utility>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/base/io.h"

namespace xs::detail {
namespace {

// 1 MiB: few syscalls for large tensors, little memory.
constexpr size_t kBufferBytes = size_t{1} << 20;

std::pair<std::string, std::string> split_path(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

std::string temp_prefix(const std::string& base) {
  return fmt::format(".{}.tmp.", base);
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path, std::string_view what)
    : path_(std::move(path)), what_(what) {
  const auto [dir, base] = split_path(path_);
  // What the path names now, through symlinks: the rename would replace a symlink, but a
  // directory or a device named directly (or /dev/stdout's link) is a mistake, and replacing
  // a device node with a file (as root, in /dev) would break the system.
  if (in_dev_or_proc(path_)) {
    throw InvalidArgument(fmt::format(
        "{} {}: in /dev or /proc, where a file written by name does not belong (a rename there "
        "would replace a device's or a descriptor's name)",
        what_, path_));
  }
  struct stat st {};
  const bool exists = ::stat(path_.c_str(), &st) == 0;
  if (base.empty() || (exists && S_ISDIR(st.st_mode))) {
    throw InvalidArgument(
        fmt::format("{} {}: the path names a directory, not a file", what_, path_));
  }
  if (exists && !S_ISREG(st.st_mode)) {
    throw InvalidArgument(fmt::format(
        "{} {}: not a regular file (a device, a FIFO or a socket), which a file cannot replace",
        what_, path_));
  }
  // A directory reached through another user's symlink is theirs to choose (the file itself
  // may be a symlink: the rename replaces it).
  if (const std::string link = foreign_symlink(dir); !link.empty()) {
    throw InvalidArgument(fmt::format(
        "{} {}: its directory is reached through {}, whose owner could point it anywhere; give "
        "its real path if you trust them",
        what_, path_, link));
  }
  temp_path_ = fmt::format("{}/{}{}.XXXXXX", dir, temp_prefix(base), ::getpid());
  fd_ = ::mkostemp(temp_path_.data(), O_CLOEXEC);  // mode 0600
  if (fd_ < 0) {
    throw IoError(
        errno_message(fmt::format("{} {}: create temporary {}", what_, path_, temp_path_), errno));
  }
  if (::fchmod(fd_, 0600) != 0) fail("fchmod 0600", errno);
  buffer_.reserve(kBufferBytes);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::fail(std::string_view step, int errno_value) {
  // The destructor removes the temporary; the target is untouched.
  throw IoError(errno_message(fmt::format("{} {}: {} (temporary {}, after {} bytes)", what_, path_,
                                          step, temp_path_, written_),
                              errno_value));
}

void AtomicFileWriter::flush() {
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write", errno);
    done += static_cast<size_t>(n);
    written_ += static_cast<uint64_t>(n);
  }
  buffer_.clear();
}

void AtomicFileWriter::write(std::span<const uint8_t> bytes) {
  if (committed_) throw InternalError(fmt::format("{} {}: write after commit", what_, path_));
  while (!bytes.empty()) {
    const size_t take = std::min(bytes.size(), kBufferBytes - buffer_.size());
    buffer_.insert(buffer_.end(), bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(take));
    bytes = bytes.subspan(take);
    if (buffer_.size() == kBufferBytes) flush();
  }
}

void AtomicFileWriter::write_zeros(size_t n_bytes) {
  static const std::vector<uint8_t> kZeros(4096, 0);
  while (n_bytes > 0) {
    const size_t take = std::min(n_bytes, kZeros.size());
    write(std::span<const uint8_t>(kZeros.data(), take));
    n_bytes -= take;
  }
}

void AtomicFileWriter::commit() {
  if (committed_) throw InternalError(fmt::format("{} {}: committed twice", what_, path_));
  flush();
  if (::fsync(fd_) != 0) fail("fsync", errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) fail("close", errno);
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) fail("rename over the target", errno);
  committed_ = true;
  // The rename is durable only once the directory entry is on disk.
  const std::string dir = split_path(path_).first;
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    throw IoError(
        errno_message(fmt::format("{} {}: open directory {} to fsync", what_, path_, dir), errno));
  }
  const int rc = ::fsync(dir_fd);
  const int fsync_errno = errno;
  ::close(dir_fd);
  if (rc != 0) {
    throw IoError(
        errno_message(fmt::format("{} {}: fsync directory {}", what_, path_, dir), fsync_errno));
  }
}

bool names_a_stream(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  if (!S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode) && !in_dev_or_proc(path)) return false;
  if (const std::string link = foreign_symlink(path); !link.empty()) {
    throw InvalidArgument(fmt::format("{} {}: reached through {}, whose owner could point it at any device; "
                                      "give its real path if you trust them",
                                      what, path, link));
  }
  if (S_ISFIFO(st.st_mode) && st.st_uid != ::geteuid() && st.st_uid != 0) {
    throw InvalidArgument(fmt::format("{} {}: a FIFO of uid {}, who would read what is written to it", what,
                                      path, st.st_uid));
  }
  return true;
}

void write_to_stream(const std::string& path, std::string_view what, std::string_view bytes) {
  // Non-blocking: a FIFO nobody reads fails the open (ENXIO) instead of waiting for ever, so
  // its reader gets kStreamReaderWaitMs to appear; a reader that stops reading gets as long
  // between two writes. O_APPEND: /dev/stdout onto a file goes after what is there.
  struct stat st {};
  const bool fifo = ::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
  int fd = -1;
  for (int waited_ms = 0;; waited_ms += 100) {
    fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0 || errno != ENXIO || !fifo || waited_ms >= kStreamReaderWaitMs) break;
    ::usleep(100'000);
  }
  if (fd < 0 && errno == ENXIO && fifo) {
    throw IoError(fmt::format("{} {}: no one has read the FIFO for {} s", what, path,
                              kStreamReaderWaitMs / 1000));
  }
  if (fd < 0) throw IoError(errno_message(fmt::format("{} {}: open", what, path), errno));
  // A reader that went away is EPIPE here, not a SIGPIPE that kills the program.
  sigset_t pipe_signal, old_mask;
  ::sigemptyset(&pipe_signal);
  ::sigaddset(&pipe_signal, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_signal, &old_mask);
  const bool written = write_all(fd, bytes, std::chrono::milliseconds(kStreamReaderWaitMs));
  const int error = written ? 0 : errno;
  if (error == EPIPE) {
    const timespec now{};
    ::sigtimedwait(&pipe_signal, nullptr, &now);  // the SIGPIPE this write raised, taken
  }
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ::close(fd);
  if (error == ETIMEDOUT) {
    throw IoError(fmt::format("{} {}: its reader has taken nothing for {} s", what, path,
                              kStreamReaderWaitMs / 1000));
  }
  if (error != 0) {
    throw IoError(errno_message(fmt::format("{} {}: write{}", what, path,
                                            error == EPIPE ? " (the reader went away)" : ""),
                                error));
  }
}

int remove_stale_temps(const std::string& path) {
  const auto [dir, base] = split_path(path);
  const std::string prefix = temp_prefix(base);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  while (const dirent* entry = ::readdir(d)) {
    const std::string_view name = entry->d_name;
    if (!name.starts_with(prefix)) continue;
    // "<prefix><pid>.XXXXXX": a writer whose pid no longer exists left it behind.
    const long pid = std::strtol(entry->d_name + prefix.size(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (::unlinkat(::dirfd(d), entry->d_name, 0) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

}  // namespace xs::detail
