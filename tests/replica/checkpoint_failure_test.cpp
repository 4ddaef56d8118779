// Failed and interrupted checkpoint saves: a real write error (RLIMIT_FSIZE makes write()
// fail with EFBIG part-way), a missing directory, a rename that fails, and a writer killed
// with SIGKILL mid-save. In every case the last good checkpoint stays loadable and no
// temporary file outlives the next save.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/checkpoint.h"
#include "xla_spawn/replica/detail/atomic_file.h"
#include "tests/replica/temp_dir.h"
#include "tests/support/child_with_deadline.h"

namespace xs {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

HostTensor big_tensor(size_t n_floats, uint8_t seed) {
  HostTensor t{"w", DType::kF32, {static_cast<int64_t>(n_floats)}, {}};
  t.bytes.resize(n_floats * 4);
  for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<uint8_t>(seed + i);
  return t;
}

// Waits for the child with a deadline (killing it when passed); its exit status or -1.
int wait_child(pid_t pid, std::chrono::seconds limit = std::chrono::seconds(120)) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 || Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // polling, bounded above
  }
}

bool has_temporary(const testing::TempDir& dir) {
  for (const std::string& name : dir.entries()) {
    if (name.starts_with(".ckpt.xsckpt.tmp.")) return true;
  }
  return false;
}

class CheckpointFailure : public ::testing::Test {
 protected:
  void SetUp() override {
    save_checkpoint(path_, {big_tensor(16, 1)}, {{"epoch", int64_t{1}}});
    good_ = testing::TempDir::read(path_);
  }
  void expect_good_file_only() {
    EXPECT_EQ(testing::TempDir::read(path_), good_);
    EXPECT_EQ(dir_.entries(), std::vector<std::string>{"ckpt.xsckpt"});
  }
  testing::TempDir dir_;
  std::string path_ = dir_.path("ckpt.xsckpt");
  std::vector<uint8_t> good_;
};

TEST_F(CheckpointFailure, WriteErrorMidFileKeepsTheOldCheckpoint) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: files may grow to 64 KiB only; the 4 MiB save fails in write() with EFBIG.
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{64 << 10, 64 << 10};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(10);
    try {
      save_checkpoint(path_, {big_tensor(1 << 20, 2)}, {{"epoch", int64_t{2}}});
    } catch (const IoError& e) {
      const std::string what = e.what();
      ::_exit(what.find("write") != std::string::npos && what.find(path_) != std::string::npos
                  ? 0
                  : 11);
    } catch (...) {
      ::_exit(12);
    }
    ::_exit(13);  // the save succeeded: the limit did not apply
  }
  const int status = wait_child(pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  expect_good_file_only();
}

TEST_F(CheckpointFailure, MissingDirectoryIsAnIoErrorNamingThePath) {
  const std::string path = dir_.path("no/such/dir/ckpt.xsckpt");
  try {
    save_checkpoint(path, {big_tensor(4, 1)}, {});
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr(path));
    EXPECT_THAT(std::string(e.what()), HasSubstr("No such file or directory"));
  }
  expect_good_file_only();
}

// A directory at the path is refused before anything is written (rename() could not replace
// it at the end).
TEST_F(CheckpointFailure, ADirectoryAtThePathIsRefusedBeforeWriting) {
  const std::string target = dir_.path("is_a_dir");
  std::filesystem::create_directory(target);
  try {
    save_checkpoint(target, {big_tensor(4, 1)}, {});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("the path names a directory, not a file"));
  }
  EXPECT_EQ(dir_.entries().size(), 2u);  // ckpt.xsckpt and is_a_dir
}

// A directory that appears at the path while the checkpoint is written: the rename fails and
// the temporary goes.
TEST_F(CheckpointFailure, FailedRenameLeavesNoTemporary) {
  const std::string target = dir_.path("late_dir");
  try {
    detail::AtomicFileWriter out(target, "checkpoint");
    std::filesystem::create_directory(target);
    std::filesystem::create_directory(target + "/child");  // rename() cannot replace it
    const uint8_t bytes[4] = {1, 2, 3, 4};
    out.write(bytes);
    out.commit();
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("rename over the target"));
  }
  EXPECT_TRUE(std::filesystem::is_directory(target + "/child"));
  EXPECT_EQ(dir_.entries().size(), 2u);  // ckpt.xsckpt and late_dir
}

// A writer SIGKILLed mid-save: the file at the path is always a complete checkpoint, and the
// temporary it left is removed by the next save.
TEST_F(CheckpointFailure, WriterKilledMidSaveNeverCorruptsTheCheckpoint) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const HostTensor t = big_tensor(8 << 20, 3);  // 32 MiB: each save takes a while
    for (int64_t i = 0; i < 10000; ++i) save_checkpoint(path_, {t}, {{"epoch", i}});
    ::_exit(0);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!has_temporary(dir_) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // polling, bounded above
  }
  const bool saw_temporary = has_temporary(dir_);
  ::kill(pid, SIGKILL);
  const int status = wait_child(pid);
  ASSERT_TRUE(saw_temporary) << "the writer never started a save";
  ASSERT_TRUE(WIFSIGNALED(status));

  const Checkpoint survived = load_checkpoint(path_);  // the old file or a complete new one
  EXPECT_EQ(survived.tensors.size(), 1u);
  save_checkpoint(path_, {big_tensor(16, 1)}, {{"epoch", int64_t{1}}});
  expect_good_file_only();
}

// What --checkpoint may point at by mistake or malice. A FIFO made --resume wait for a writer
// for ever (the load opened before it looked); a huge sparse file was std::bad_alloc. Both are
// refused at once with a message naming the path. The load runs in a child with a deadline, so
// a hang fails the test.
TEST(CheckpointPath, AFifoOrAnOversizedFileIsRefusedAtOnceNamingIt) {
  testing::TempDir dir;
  const std::string fifo = dir.path("fifo.ckpt");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string huge = dir.path("huge.ckpt");
  {
    const int fd = ::open(huge.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    const bool sparse = ::ftruncate(fd, off_t{100} << 30) == 0;  // 100 GiB, no blocks
    ::close(fd);
    ASSERT_TRUE(sparse) << "this filesystem cannot hold a 100 GiB sparse file";
  }
  for (const std::string& path : {fifo, huge}) {
    const xs::testing::ChildOutcome r = xs::testing::run_in_child([&path] {
      try {
        load_checkpoint(path);
      } catch (const InvalidArgument& e) {
        const std::string what = e.what();
        const bool named = what.find(path) != std::string::npos;
        return named && (what.find("not a regular file") != std::string::npos ||
                         what.find("bytes, more than") != std::string::npos)
                   ? 0
                   : 3;
      }
      return 1;
    });
    ASSERT_FALSE(r.hung) << "loading " << path << " hung";
    EXPECT_EQ(r.exit_code, 0) << path << " (1: loaded, 2: another error, 3: unnamed)";
  }
}

}  // namespace
}  // namespace xs
