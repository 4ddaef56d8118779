// The persistent compile cache (issue 16, acceptance 5): a second run of the same step
// compiles nothing, a damaged or foreign entry is rebuilt with a warning, a directory others
// could write or reach through their symlinks is refused, the directory is used as opened,
// replicas storing one entry at once leave one whole entry, and a full disk makes room.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "xla_spawn/runtime/compiler/object_cache.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"
#include "tests/support/child_with_deadline.h"
#include "tests/support/captured_log.h"

namespace xs {
namespace {

namespace fs = std::filesystem;

using testing::CapturedLog;

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "xs-object-cache-XXXXXX").string();
    path_ = ::mkdtemp(t.data());
    dir_ = path_ + "/cache";
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& cache() const { return dir_; }
  std::vector<fs::path> entries(const std::string& ext = ".xso") const {
    std::vector<fs::path> out;
    if (!fs::exists(dir_)) return out;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().string().find(ext) != std::string::npos) out.push_back(e.path());
    return out;
  }

 private:
  std::string path_, dir_;
};

struct StepRun {
  std::vector<float> values;
  int64_t native_compiles, disk_hits;
};

// One training-like step with a fused loop and a matmul epilogue, in a fresh runtime.
StepRun run_step(const std::optional<std::string>& cache_dir, bool codegen = true) {
  RuntimeOptions options = RuntimeOptions::from_env();
  options.codegen = codegen;
  options.compile_cache_dir = cache_dir;
  ScopedRuntime rt(options);
  std::vector<float> xs(64 * 48), ws(48 * 40), bs(40);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i % 17) * 0.25f - 2;
  for (size_t i = 0; i < ws.size(); ++i) ws[i] = static_cast<float>(i % 13) * 0.125f - 0.75f;
  for (size_t i = 0; i < bs.size(); ++i) bs[i] = static_cast<float>(i) * 0.01f;
  const Tensor x = Tensor::from_vector<float>(xs, {64, 48});
  const Tensor w = Tensor::from_vector<float>(ws, {48, 40});
  const Tensor b = Tensor::from_vector<float>(bs, {40});
  Tensor y = tanh(relu(matmul(x, w) + b) * Tensor::scalar(0.5)) - sigmoid(b);
  mark_step();
  return {y.to_vector<float>(), runtime().metrics().counter(kCounterNativeCompile),
          runtime().metrics().counter(kCounterPersistentCacheHit)};
}

std::vector<float> interpreted_step() { return run_step(std::nullopt, false).values; }

TEST(ObjectCache, ASecondProcessRunningTheSameStepCompilesNothing) {
  TempDir dir;
  const std::vector<float> reference = interpreted_step();
  // Each run in its own process, as a restarted job or the next run would be.
  const testing::ChildOutcome first = testing::run_in_child([&] {
    const StepRun r = run_step(dir.cache());
    return r.values == reference && r.native_compiles == 1 && r.disk_hits == 0 ? 0 : 1;
  });
  ASSERT_FALSE(first.hung);
  ASSERT_EQ(first.exit_code, 0) << "the first run should compile once and match the interpreter";
  ASSERT_EQ(dir.entries().size(), 1u);
  const testing::ChildOutcome second = testing::run_in_child([&] {
    const StepRun r = run_step(dir.cache());
    return r.values == reference && r.native_compiles == 0 && r.disk_hits == 1 ? 0 : 1;
  });
  ASSERT_FALSE(second.hung);
  EXPECT_EQ(second.exit_code, 0) << "the second run should load the object (PersistentCacheHit 1, NativeCompile 0)";
  EXPECT_EQ(fs::status(dir.cache()).permissions() & fs::perms::all, fs::perms::owner_all);
}

// Damages the one entry with `damage`, then expects the next run to warn with `warning`,
// compile, and leave an entry the run after loads.
void expect_rebuilt(const std::function<void(const fs::path&)>& damage, const std::string& warning) {
  TempDir dir;
  const StepRun first = run_step(dir.cache());
  ASSERT_EQ(first.native_compiles, 1);
  ASSERT_EQ(dir.entries().size(), 1u);
  const fs::path entry = dir.entries()[0];
  damage(entry);
  {
    CapturedLog log;
    const StepRun second = run_step(dir.cache());
    EXPECT_EQ(second.native_compiles, 1) << warning;
    EXPECT_EQ(second.disk_hits, 0) << warning;
    EXPECT_EQ(second.values, first.values);
    EXPECT_NE(log.text().find(warning), std::string::npos) << "log: " << log.text();
    EXPECT_NE(log.text().find(entry.string()), std::string::npos) << "the warning names the file: " << log.text();
  }
  const StepRun third = run_step(dir.cache());
  EXPECT_EQ(third.disk_hits, 1) << "the rebuilt entry is whole again (" << warning << ")";
  EXPECT_EQ(third.native_compiles, 0);
  EXPECT_TRUE(dir.entries(".tmp").empty());
}

TEST(ObjectCache, ATruncatedEntryIsRebuiltWithAWarning) {
  expect_rebuilt([](const fs::path& p) { fs::resize_file(p, fs::file_size(p) / 2); }, "is truncated");
  expect_rebuilt([](const fs::path& p) { fs::resize_file(p, 10); }, "is truncated");
}

TEST(ObjectCache, ACorruptOrForeignEntryIsRebuiltWithAWarning) {
  expect_rebuilt(
      [](const fs::path& p) {
        std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(static_cast<std::streamoff>(fs::file_size(p) / 2));
        f.put('\x5a').put('\xa5');
      },
      "is corrupt");
  expect_rebuilt(
      [](const fs::path& p) {
        std::ofstream(p, std::ios::binary | std::ios::trunc) << std::string(4096, '\x7f') << "ELF not ours";
      },
      "bad magic");
  // Another entry's file under this name: a whole, valid entry for another key.
  expect_rebuilt(
      [](const fs::path& p) {
        std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(8);
        f.put('\x01');
      },
      "holds key");
  expect_rebuilt(
      [](const fs::path& p) {
        fs::remove(p);
        fs::create_symlink("/etc/hostname", p);
      },
      "cannot open");
}

// Another user's entry or directory: ownership can only be given away as root.
TEST(ObjectCache, AnotherUsersEntryIsRebuiltAndAnotherUsersDirectoryRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user (chown)";
  constexpr uid_t kNobody = 65534;
  expect_rebuilt([](const fs::path& p) { ASSERT_EQ(::chown(p.c_str(), kNobody, kNobody), 0); }, "belongs to uid 65534");
  TempDir dir;
  fs::create_directories(dir.cache());
  ASSERT_EQ(::chown(dir.cache().c_str(), kNobody, kNobody), 0);
  CapturedLog log;
  const StepRun r = run_step(dir.cache());
  EXPECT_EQ(r.native_compiles, 1);
  EXPECT_TRUE(dir.entries().empty()) << "nothing is written to another user's directory";
  EXPECT_NE(log.text().find("belongs to uid 65534"), std::string::npos) << log.text();
}

TEST(ObjectCache, ADirectoryOthersCanWriteIsRefusedWithAWarning) {
  TempDir dir;
  fs::create_directories(dir.cache());
  fs::permissions(dir.cache(), fs::perms::all);  // 0777
  CapturedLog log;
  const StepRun r = run_step(dir.cache());
  EXPECT_EQ(r.native_compiles, 1);
  EXPECT_TRUE(dir.entries().empty()) << "nothing is written to a directory others could write";
  EXPECT_NE(log.text().find("not writable by group or others"), std::string::npos) << log.text();
}

// The directory itself must not be a symlink (its target's owner and mode are not what the
// user chose), with or without a trailing slash, which would make lstat follow it.
TEST(ObjectCache, ASymlinkedDirectoryIsRefusedWithOrWithoutATrailingSlash) {
  TempDir dir;
  fs::create_directories(dir.cache() + ".real");
  fs::permissions(dir.cache() + ".real", fs::perms::owner_all, fs::perm_options::replace);
  fs::create_directory_symlink(dir.cache() + ".real", dir.cache());
  for (const std::string& path : {dir.cache(), dir.cache() + "/", dir.cache() + "//"}) {
    CapturedLog log;
    const StepRun r = run_step(path);
    EXPECT_EQ(r.native_compiles, 1) << path;
    EXPECT_TRUE(fs::is_empty(dir.cache() + ".real")) << path;
    EXPECT_NE(log.text().find("a symlink is not followed"), std::string::npos) << path << log.text();
  }
}

// A symlink another user owns, anywhere on the way to the directory, lets its owner point the
// cache anywhere at any moment: "link/." and "link/cache" went through it before.
TEST(ObjectCache, APathThroughAnotherUsersSymlinkIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a symlink to another user (lchown)";
  TempDir dir;
  const std::string real = dir.cache() + ".real", link = dir.cache() + ".link";
  fs::create_directories(real);
  fs::permissions(real, fs::perms::owner_all, fs::perm_options::replace);
  fs::create_directory_symlink(real, link);
  ASSERT_EQ(::lchown(link.c_str(), 65534, 65534), 0);
  for (const std::string& path : {link + "/.", link + "/cache"}) {
    CapturedLog log;
    const StepRun r = run_step(path);
    EXPECT_EQ(r.native_compiles, 1) << path;
    EXPECT_TRUE(fs::is_empty(real)) << path;
    EXPECT_NE(log.text().find("(a symlink of uid 65534)"), std::string::npos) << path << log.text();
  }
  // Nor through a link of the user's own that leads through another user's.
  const std::string own_link = dir.cache() + ".own";
  fs::create_directory_symlink(link, own_link);
  {
    CapturedLog log;
    run_step(own_link + "/cache");
    EXPECT_TRUE(fs::is_empty(real));
    EXPECT_NE(log.text().find(link + " (a symlink of uid 65534)"), std::string::npos) << log.text();
  }
  // The user's own symlink (or root's) is theirs to follow.
  ASSERT_EQ(::lchown(link.c_str(), ::geteuid(), ::getegid()), 0);
  detail::ObjectCache own(link + "/.");
  EXPECT_TRUE(own.usable());
}

// The directory is used as it was opened: renaming it and putting another in its place (or a
// symlink to one) while a run goes on does not move that run's entries there.
TEST(ObjectCache, EntriesGoToTheDirectoryAsOpenedWhateverThePathBecomes) {
  TempDir dir;
  detail::ObjectCache cache(dir.cache());
  ASSERT_TRUE(cache.usable());
  const std::vector<char> object(1000, 'x');
  ASSERT_TRUE(cache.store(1, object));
  fs::rename(dir.cache(), dir.cache() + ".moved");
  fs::create_directories(dir.cache() + ".elsewhere");
  fs::create_directory_symlink(dir.cache() + ".elsewhere", dir.cache());
  ASSERT_TRUE(cache.store(2, object));
  EXPECT_TRUE(cache.load(1).has_value());
  EXPECT_TRUE(fs::exists(dir.cache() + ".moved/" + fs::path(cache.path(2)).filename().string()));
  EXPECT_TRUE(fs::is_empty(dir.cache() + ".elsewhere"));
}

// A full disk makes room by removing the least recently used entries before giving up on a
// store (else a stale cache on a full disk never caches anything again).
TEST(ObjectCache, AFullDiskRemovesTheOldestEntriesToMakeRoom) {
  if (::geteuid() != 0 || ::access("/proc/self/ns/mnt", F_OK) != 0) {
    GTEST_SKIP() << "needs root to mount a small tmpfs in a private mount namespace";
  }
  TempDir dir;
  fs::create_directories(dir.cache());
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(60);
    if (::unshare(CLONE_NEWNS) != 0 || ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", dir.cache().c_str(), "tmpfs", 0, "size=256k,mode=0700") != 0) {
      ::_exit(10);
    }
    detail::ObjectCache cache(dir.cache());
    const std::vector<char> object(100'000, 'x');
    for (uint64_t key = 1; key <= 5; ++key) {
      if (!cache.store(key, object)) ::_exit(static_cast<int>(key));
    }
    // Two fit in 256 KiB: the last two stored are there, the first three made room.
    const bool kept = cache.load(5).has_value() && cache.load(4).has_value() && !cache.load(1).has_value();
    ::_exit(kept ? 0 : 20);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  if (WEXITSTATUS(status) == 10) GTEST_SKIP() << "cannot mount a tmpfs in a private mount namespace here";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1-5: that store failed; 20: the wrong entries were kept";
}

TEST(ObjectCache, ReplicasStoringTheSameEntryAtOnceLeaveOneWholeEntry) {
  TempDir dir;
  const std::vector<float> reference = interpreted_step();
  constexpr int kReplicas = 4;
  std::vector<pid_t> pids;
  for (int i = 0; i < kReplicas; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(60);
      int code = 1;
      try {
        code = run_step(dir.cache()).values == reference ? 0 : 1;
      } catch (...) {
      }
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  EXPECT_EQ(dir.entries().size(), 1u);
  EXPECT_TRUE(dir.entries(".tmp").empty()) << "no temporary file is left behind";
  const StepRun after = run_step(dir.cache());
  EXPECT_EQ(after.disk_hits, 1);
  EXPECT_EQ(after.values, reference);
}

// Sets a file's modification time `seconds_ago` seconds into the past.
void age(const std::string& path, int seconds_ago) {
  timespec times[2];
  ::clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= seconds_ago;
  times[1] = times[0];
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

// Past its size the directory loses its least recently used entries (a hit counts as a use),
// and a temporary that a crashed store left; other files are not its to remove.
TEST(ObjectCache, PastItsSizeTheLeastRecentlyUsedEntriesGo) {
  TempDir dir;
  const std::vector<char> object(100'000, 'x');
  const uint64_t entry_bytes = object.size() + 32;  // the header
  detail::ObjectCache cache(dir.cache(), 3 * entry_bytes);
  ASSERT_TRUE(cache.usable());
  for (uint64_t key : {1, 2, 3}) ASSERT_TRUE(cache.store(key, object));
  age(cache.path(1), 300);
  age(cache.path(2), 200);
  age(cache.path(3), 100);
  const std::string stale_temp = cache.path(9) + ".tmp.abcdef", fresh_temp = cache.path(8) + ".tmp.ghijkl";
  std::ofstream(stale_temp) << "crashed";
  std::ofstream(fresh_temp) << "being written";
  age(stale_temp, 2 * detail::ObjectCache::kStaleTempSeconds);
  std::ofstream(dir.cache() + "/notes.txt") << "mine";
  // Named like an entry but not one (not 16 hex digits): not the cache's to remove.
  const std::string lookalike = dir.cache() + "/my-thesis-final1.xso";
  std::ofstream(lookalike) << "mine too";
  age(lookalike, 1000);
  ASSERT_TRUE(cache.load(1).has_value());  // 1 is used now: 2 is the least recently used
  ASSERT_TRUE(cache.store(4, object));
  EXPECT_TRUE(fs::exists(cache.path(1)));
  EXPECT_FALSE(fs::exists(cache.path(2)));
  EXPECT_TRUE(fs::exists(cache.path(3)));
  EXPECT_TRUE(fs::exists(cache.path(4)));
  EXPECT_FALSE(fs::exists(stale_temp));
  EXPECT_TRUE(fs::exists(fresh_temp));
  EXPECT_TRUE(fs::exists(dir.cache() + "/notes.txt"));
  EXPECT_TRUE(fs::exists(lookalike));
  // An entry bigger than the whole size stays (it was just stored) and pushes all others out.
  detail::ObjectCache small(dir.cache(), entry_bytes / 2);
  ASSERT_TRUE(small.store(5, object));
  for (uint64_t key : {1, 3, 4}) EXPECT_FALSE(fs::exists(cache.path(key))) << key;
  EXPECT_TRUE(fs::exists(cache.path(5)));
}

}  // namespace
}  // namespace xs
