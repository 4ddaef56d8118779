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

}  // namespace

ObjectCache::ObjectCache(std::string dir, uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {
  // "cache/" would make lstat follow a symlink named cache.
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) {
    spdlog::warn("compile cache: cannot create {}: {}; compiling without a disk cache", dir_, std::strerror(errno));
    return;
  }
  struct stat st {};
  if (::lstat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    spdlog::warn("compile cache: {} is not a directory (a symlink is not followed); compiling without a disk cache", dir_);
    return;
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
    spdlog::warn(
        "compile cache: {} belongs to uid {} with mode {:o}; its objects are code this process would run, so it "
        "must be owned by uid {} and not writable by group or others; compiling without a disk cache",
        dir_, st.st_uid, st.st_mode & 07777, ::geteuid());
    return;
  }
  usable_ = true;
}

std::string ObjectCache::path(uint64_t key) const { return fmt::format("{}/{:016x}.xso", dir_, key); }

std::optional<std::vector<char>> ObjectCache::load(uint64_t key) const {
  if (!usable_) return std::nullopt;
  const std::string file = path(key);
  const int fd = ::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
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
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return bad("is not a regular file");
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
  if (!write_file_atomically(file, {{reinterpret_cast<const char*>(&h), sizeof h},
                                    {bytes.data(), bytes.size()}})) {
    spdlog::warn("compile cache: cannot write {}: {}; this program is not cached", file,
                 std::strerror(errno));
    return false;
  }
  evict(file);
  return true;
}

void ObjectCache::evict(const std::string& keep) const {
  struct Entry {
    std::string path;
    uint64_t bytes;
    timespec used;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  const time_t now = ::time(nullptr);
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const bool entry = name.size() == 20 && name.ends_with(".xso");
    const bool temp = name.find(".xso.tmp.") == 16;
    if (!entry && !temp) continue;
    const std::string path = dir_ + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    if (temp) {
      if (now - st.st_mtim.tv_sec > kStaleTempSeconds) ::unlink(path.c_str());
      continue;
    }
    total += static_cast<uint64_t>(st.st_size);
    if (path != keep) entries.push_back({path, static_cast<uint64_t>(st.st_size), st.st_mtim});
  }
  ::closedir(d);
  if (total <= max_bytes_) return;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.used.tv_sec, a.used.tv_nsec) < std::tie(b.used.tv_sec, b.used.tv_nsec);
  });
  size_t removed = 0;
  uint64_t freed = 0;
  for (const Entry& e : entries) {
    if (total <= max_bytes_) break;
    if (::unlink(e.path.c_str()) == 0 || errno == ENOENT) {  // ENOENT: another replica took it
      total -= e.bytes;
      freed += e.bytes;
      ++removed;
    }
  }
  spdlog::info("compile cache: removed {} least recently used entries ({:.1f} MiB) to keep {} under {:.1f} MiB",
               removed, static_cast<double>(freed) / (1 << 20), dir_, static_cast<double>(max_bytes_) / (1 << 20));
}

}  // namespace xs::detail
