#include "xla_spawn/runtime/compiler/object_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <tuple>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/base/io.h"
#include "xla_spawn/runtime/hash.h"

namespace xs::detail {
namespace {

constexpr char kMagic[8] = {'X', 'S', 'O', 'B', 'J', '0', '0', '1'};

struct Header {
  char magic[8];
  uint64_t key;
  uint64_t size;          // payload bytes after the header
  uint64_t payload_hash;  // payload_hash() of them
};
static_assert(sizeof(Header) == 32);

uint64_t payload_hash(std::span<const char> bytes) {
  return hash_bytes(kHashSeed, std::string_view(bytes.data(), bytes.size()));
}

// Reads exactly `n` bytes; false at end of file or on an error.
bool read_all(int fd, char* out, size_t n) {
  while (n > 0) {
    const ssize_t got = ::read(fd, out, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// "0123456789abcdef.xso" and the temporaries of a store, "<that>.tmp.XXXXXX".
bool is_entry_name(std::string_view name) {
  if (name.size() < 20 || name.substr(16, 4) != ".xso") return false;
  return std::all_of(name.begin(), name.begin() + 16,
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace

ObjectCache::ObjectCache(std::string dir, uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {
  // "cache/" would make lstat follow a symlink named cache.
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  auto refuse = [&](const std::string& why) {
    spdlog::warn("compile cache: {} {}; compiling without a disk cache", dir_, why);
  };
  if (const std::string link = foreign_symlink(dir_); !link.empty()) {
    refuse(fmt::format("goes through {}: its owner could point the cache anywhere", link));
    return;
  }
  if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) {
    refuse(fmt::format("cannot be created: {}", std::strerror(errno)));
    return;
  }
  // Everything after this goes through the directory opened here (/proc/self/fd/N), never
  // through the path again, so no one can swap the directory under a run that checked it.
  dir_fd_ = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st {};
  if (dir_fd_ < 0 || ::fstat(dir_fd_, &st) != 0) {
    refuse("is not a directory (a symlink is not followed)");
    return;
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
    refuse(fmt::format(
        "belongs to uid {} with mode {:o}; its objects are code this process would run, so it must be owned by "
        "uid {} and not writable by group or others",
        st.st_uid, st.st_mode & 07777, ::geteuid()));
    return;
  }
  at_ = fmt::format("/proc/self/fd/{}", dir_fd_);
  struct stat through {};
  if (::stat(at_.c_str(), &through) != 0 || through.st_ino != st.st_ino || through.st_dev != st.st_dev) {
    refuse("cannot be reached through /proc/self/fd (is /proc mounted?)");
    return;
  }
  usable_ = true;
}

ObjectCache::~ObjectCache() {
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

std::string ObjectCache::path(uint64_t key) const { return fmt::format("{}/{}", dir_, name(key)); }

std::string ObjectCache::name(uint64_t key) { return fmt::format("{:016x}.xso", key); }

std::optional<std::vector<char>> ObjectCache::load(uint64_t key) const {
  if (!usable_) return std::nullopt;
  const std::string file = path(key);
  const int fd = ::openat(dir_fd_, name(key).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) spdlog::warn("compile cache: cannot open {}: {}; compiling again", file, std::strerror(errno));
    return std::nullopt;
  }
  Fd closer(fd);
  auto bad = [&](const std::string& why) -> std::optional<std::vector<char>> {
    spdlog::warn("compile cache: {} {}; compiling again and replacing it", file, why);
    return std::nullopt;
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    spdlog::warn("compile cache: {} is not a regular file; compiling again, not cached until it is removed", file);
    return std::nullopt;
  }
  if (st.st_uid != ::geteuid()) return bad(fmt::format("belongs to uid {}, not this user", st.st_uid));
  Header h{};
  if (!read_all(fd, reinterpret_cast<char*>(&h), sizeof h)) return bad(fmt::format("is truncated ({} bytes, no header)", st.st_size));
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return bad("is not a compile cache entry (bad magic)");
  if (h.key != key) return bad(fmt::format("holds key {:016x}", h.key));
  if (h.size > kMaxEntryBytes) return bad(fmt::format("claims {} bytes", h.size));
  if (static_cast<uint64_t>(st.st_size) != sizeof h + h.size) {
    return bad(fmt::format("is truncated or padded: {} bytes, the header says {}", st.st_size, sizeof h + h.size));
  }
  std::vector<char> bytes(h.size);
  if (!read_all(fd, bytes.data(), bytes.size())) return bad("could not be read whole");
  if (payload_hash(bytes) != h.payload_hash) return bad("is corrupt (its payload does not match its hash)");
  ::futimens(fd, nullptr);  // used now: the last to be evicted
  return bytes;
}

bool ObjectCache::store(uint64_t key, std::span<const char> bytes) const {
  if (!usable_) return false;
  const std::string file = path(key);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.key = key;
  h.size = bytes.size();
  h.payload_hash = payload_hash(bytes);
  const std::string through = fmt::format("{}/{}", at_, name(key));
  auto write = [&] {
    return write_file_atomically(through, {{reinterpret_cast<const char*>(&h), sizeof h}, {bytes.data(), bytes.size()}});
  };
  bool written = write();
  if (!written && errno == ENOSPC) {
    // A full disk: older entries make room for this one, then one more try.
    evict(name(key), sizeof h + bytes.size());
    written = write();
  }
  if (!written) {
    spdlog::warn("compile cache: cannot write {}: {}; this program is not cached", file, std::strerror(errno));
    return false;
  }
  evict(name(key), 0);
  return true;
}

void ObjectCache::evict(const std::string& keep, uint64_t free_at_least) const {
  struct Entry {
    std::string name;
    uint64_t bytes;
    timespec used;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  const time_t now = ::time(nullptr);
  const int fd = ::openat(dir_fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);  // its own offset
  DIR* d = fd < 0 ? nullptr : ::fdopendir(fd);
  if (d == nullptr) {
    if (fd >= 0) ::close(fd);
    return;
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!is_entry_name(name)) continue;
    const bool temp = name.size() > 20;
    if (temp && !name.substr(20).starts_with(".tmp.")) continue;
    struct stat st {};
    if (::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != ::geteuid()) {
      continue;
    }
    if (temp) {
      if (now - st.st_mtim.tv_sec > kStaleTempSeconds) ::unlinkat(fd, name.c_str(), 0);
      continue;
    }
    total += static_cast<uint64_t>(st.st_size);
    if (name != keep) entries.push_back({name, static_cast<uint64_t>(st.st_size), st.st_mtim});
  }
  if (total <= max_bytes_ && free_at_least == 0) {
    ::closedir(d);
    return;
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.used.tv_sec, a.used.tv_nsec) < std::tie(b.used.tv_sec, b.used.tv_nsec);
  });
  size_t removed = 0;
  uint64_t freed = 0;
  for (const Entry& e : entries) {
    if (total <= max_bytes_ && freed >= free_at_least) break;
    if (::unlinkat(fd, e.name.c_str(), 0) == 0 || errno == ENOENT) {  // ENOENT: another replica took it
      total -= e.bytes;
      freed += e.bytes;
      ++removed;
    }
  }
  ::closedir(d);
  spdlog::info("compile cache: removed {} least recently used entries ({:.1f} MiB) to keep {} under {:.1f} MiB{}",
               removed, static_cast<double>(freed) / (1 << 20), dir_, static_cast<double>(max_bytes_) / (1 << 20),
               free_at_least > 0 ? " and make room on a full disk" : "");
}

}  // namespace xs::detail
