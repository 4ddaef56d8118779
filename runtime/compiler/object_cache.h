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
// others may write, is refused (warned once, then no disk cache), and an entry that is a
// symlink is not followed (the directory path itself is taken as given). Storing is best effort: a full disk costs a warning, not the job.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace xs::detail {

class ObjectCache {
 public:
  static constexpr uint64_t kMaxEntryBytes = uint64_t{256} << 20;  // far above any program's object

  // Creates `dir` (mode 0700) when missing. usable() is false, after one warning, when it is
  // not a directory owned by this user and closed to group and others.
  explicit ObjectCache(std::string dir);

  bool usable() const { return usable_; }
  const std::string& dir() const { return dir_; }
  std::string path(uint64_t key) const;

  // The entry's object bytes, or nullopt: missing (silently), or unreadable / truncated /
  // corrupt / another key's (with a warning naming the file and what is wrong).
  std::optional<std::vector<char>> load(uint64_t key) const;
  // Writes the entry atomically; false (with a warning) when it could not.
  bool store(uint64_t key, std::span<const char> bytes) const;

 private:
  std::string dir_;
  bool usable_ = false;
};

}  // namespace xs::detail
