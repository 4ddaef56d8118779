#include "xla_spawn/base/io.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"

namespace xs {

bool write_all(int fd, std::string_view bytes, std::optional<std::chrono::milliseconds> stall_limit) {
  auto last_progress = std::chrono::steady_clock::now();
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
      if (stall_limit) last_progress = std::chrono::steady_clock::now();
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (stall_limit && std::chrono::steady_clock::now() - last_progress > *stall_limit) {
        errno = ETIMEDOUT;
        return false;
      }
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);  // a non-blocking console: wait for room, bounded per try
    } else {
      if (n == 0) errno = ENOSPC;
      return false;
    }
  }
  return true;
}

bool write_file_atomically(const std::string& path, std::initializer_list<std::string_view> parts,
                           mode_t mode) {
  std::string temp = path + ".tmp.XXXXXX";
  const int fd = ::mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::fchmod(fd, mode) == 0;
  for (std::string_view part : parts) ok = ok && write_all(fd, part);
  int error = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    error = errno;
  }
  if (ok && ::rename(temp.c_str(), path.c_str()) == 0) return true;
  if (ok) error = errno;
  ::unlink(temp.c_str());
  errno = error;
  return false;
}

namespace {

// The length of the UTF-8 sequence at `text[i]` (2..4), or 0 when it is not one.
size_t utf8_sequence(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  const size_t n = lead >= 0xf0 && lead <= 0xf4 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc2 ? 2 : 0;
  if (n == 0 || lead >= 0xf5 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
  }
  return n;
}

}  // namespace

std::string printable_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      ++i;
    } else if (const size_t n = c >= 0x80 ? utf8_sequence(text, i) : 0; n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    }
  }
  return out;
}

std::string_view utf8_prefix(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t end = max_bytes;
  // Back over continuation bytes to the start of the character the cut would split.
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xc0) == 0x80) --end;
  return text.substr(0, end);
}

bool in_dev_or_proc(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  char resolved[PATH_MAX];
  if (::realpath(dir.c_str(), resolved) == nullptr) return false;
  const std::string_view real = resolved;
  if (real == "/dev/shm" || real.starts_with("/dev/shm/")) return false;
  return real == "/dev" || real.starts_with("/dev/") || real == "/proc" || real.starts_with("/proc/");
}

std::string foreign_symlink(const std::string& path) {
  // Resolved one component at a time, as the kernel does, so a link reached through another
  // link is checked too; `at` stays free of symlinks, so ".." can be taken lexically.
  std::string at;
  if (!path.starts_with('/')) {
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd) == nullptr) {
      return errno_message("the working directory (it cannot be checked: getcwd)", errno);
    }
    at = cwd == std::string_view("/") ? "" : cwd;
  }
  std::deque<std::string> rest;
  auto push_front = [&rest](const std::string& p) {
    std::vector<std::string> parts;
    for (size_t i = 0; i <= p.size();) {
      const size_t end = std::min(p.find('/', i), p.size());
      if (end > i) parts.push_back(p.substr(i, end - i));
      i = end + 1;
    }
    rest.insert(rest.begin(), parts.begin(), parts.end());
  };
  push_front(path);
  for (int links = 0; !rest.empty();) {
    const std::string name = rest.front();
    rest.pop_front();
    if (name == ".") continue;
    if (name == "..") {
      const size_t slash = at.rfind('/');
      at.resize(slash == std::string::npos ? 0 : slash);
      continue;
    }
    const std::string next = at + "/" + name;
    struct stat st {};
    if (::lstat(next.c_str(), &st) != 0) {
      // Missing: the rest does not exist yet (the open that follows fails or creates it);
      // anything else (a path too long, no permission) is what cannot be checked.
      if (errno == ENOENT || errno == ENOTDIR) return "";
      return errno_message(next + " (it cannot be checked: lstat)", errno);
    }
    if (S_ISLNK(st.st_mode)) {
      if (st.st_uid != ::geteuid() && st.st_uid != 0) {
        return fmt::format("{} (a symlink of uid {})", next, st.st_uid);
      }
      char target[4096];
      const ssize_t n = ::readlink(next.c_str(), target, sizeof target - 1);
      if (n <= 0) return errno_message(next + " (it cannot be checked: readlink)", errno);
      if (++links > 40) return next + " (more than 40 symlinks: a loop?)";
      const std::string to(target, static_cast<size_t>(n));
      if (to.starts_with('/')) at.clear();
      push_front(to);
      continue;
    }
    at = next;
  }
  return "";
}

}  // namespace xs
