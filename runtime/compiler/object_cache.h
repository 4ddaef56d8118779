#pragma once
// The persistent compile cache (XLA_SPAWN_COMPILE_CACHE_DIR, as PyTorch/XLA's
// XLA_PERSISTENT_CACHE_PATH): compiled objects on disk, so a restarted job or the next run
// loads a program's native code instead of compiling it again.
//
//   ObjectCache cache("/var/cache/job");            // created 0700 when missing
//   if (auto bytes = cache.load(key)) ...; else cache.store(key, compile());
//
// One file per entry, `<key, 16 hex digits>.xso`: a 32-byte header (magic, key, payload size,
// payload hash) then the object. A truncated, corrupt or foreign entry is a miss with a
// warning, and the caller's store replaces it. A store writes a temporary file and renames it
// over the entry, so replicas storing the same entry at once never expose a partial file. The
// objects are code this process will run, so a directory that is not this user's own, or that
// others may write, or a path through a symlink of another user (root's excepted), is refused
// (warned once, then no disk cache). The directory is opened once and every later read, write
// and removal goes through that handle (/proc/self/fd/N), so the path cannot be pointed
// elsewhere under a run that checked it; an entry that is a symlink is not followed. Storing is
// best effort: a full disk first removes the least recently used entries to make room, then
// costs a warning, not the job. The directory is kept under a size
// (XLA_SPAWN_COMPILE_CACHE_MAX_MB, 256 MiB by default): a hit refreshes its entry's
// modification time, and a store that takes the entries past the size removes the least
// recently used ones, and temporaries a crashed store left behind; only this user's regular
// files named like entries (16 hex digits, .xso) are ever removed.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace xs::detail {

class ObjectCache {
 public:
  static constexpr uint64_t kMaxEntryBytes = uint64_t{256} << 20;  // far above any program's object
  // Entries are a few KB to a few hundred KB: thousands of programs fit.
  static constexpr uint64_t kDefaultMaxBytes = uint64_t{256} << 20;
  // A temporary this much older than now is a crashed store's.
  static constexpr int64_t kStaleTempSeconds = 600;

  // Creates `dir` (mode 0700) when missing. usable() is false, after one warning, when it is
  // not a directory owned by this user and closed to group and others.
  explicit ObjectCache(std::string dir, uint64_t max_bytes = kDefaultMaxBytes);
  ~ObjectCache();
  ObjectCache(const ObjectCache&) = delete;
  ObjectCache& operator=(const ObjectCache&) = delete;

  bool usable() const { return usable_; }
  const std::string& dir() const { return dir_; }
  std::string path(uint64_t key) const;

  // The entry's object bytes, or nullopt: missing (silently), or unreadable / truncated /
  // corrupt / another key's (with a warning naming the file and what is wrong).
  std::optional<std::vector<char>> load(uint64_t key) const;
  // Writes the entry atomically, then keeps the directory under its size; false (with a
  // warning) when it could not write.
  bool store(uint64_t key, std::span<const char> bytes) const;

 private:
  static std::string name(uint64_t key);  // "<key, 16 hex digits>.xso"
  // Removes the least recently used entries (never the one named `keep`) until they total at
  // most max_bytes_ and at least `free_at_least` bytes are freed, and stale temporaries; only
  // regular files of this user named like entries.
  void evict(const std::string& keep, uint64_t free_at_least) const;

  std::string dir_;
  int dir_fd_ = -1;
  std::string at_;  // "/proc/self/fd/<dir_fd_>": the directory as opened
  uint64_t max_bytes_;
  bool usable_ = false;
};

}  // namespace xs::detail
