// A replica the kernel's OOM killer takes is named as such, not as a bare "signal 9": the job
// runs in a memory cgroup of its own (root, a writable cgroup v1 or v2 memory controller; the
// test says what is missing and skips otherwise) too small for what one replica touches.

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "xla_spawn/launcher/oom_watch.h"
#include "tests/launcher/launch_support.h"

namespace xs::testing {
namespace {

bool write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

// A child of this process's memory cgroup with a memory limit, removed (once empty) at the end.
class MemoryCgroup {
 public:
  explicit MemoryCgroup(const std::string& limit) {
    const std::string counter = own_memory_events_file();
    if (counter.empty()) {
      missing_ = "no readable memory cgroup (memory.events or memory.oom_control) for this process";
      return;
    }
    const std::filesystem::path parent = std::filesystem::path(counter).parent_path();
    path_ = (parent / ("xs-oom-test-" + std::to_string(::getpid()))).string();
    if (::mkdir(path_.c_str(), 0755) != 0) {
      missing_ = "cannot create a memory cgroup under " + parent.string() + ": " + std::strerror(errno);
      path_.clear();
      return;
    }
    const bool v1 = counter.ends_with("memory.oom_control");
    if (!write_text(path_ + (v1 ? "/memory.limit_in_bytes" : "/memory.max"), limit)) {
      missing_ = "cannot set the memory limit of " + path_;
      return;
    }
    if (!v1 && std::filesystem::exists(path_ + "/memory.swap.max")) {
      write_text(path_ + "/memory.swap.max", "0");
    }
  }
  ~MemoryCgroup() {
    if (path_.empty()) return;
    // Its processes have exited; the kernel may take a moment to let it go.
    wait_until([&] { return ::rmdir(path_.c_str()) == 0 || errno == ENOENT; },
               std::chrono::seconds(5));
  }
  const std::string& missing() const { return missing_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string missing_;
};

TEST(OomTest, AReplicaTheOomKillerTakesIsNamedAsSuch) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a memory cgroup";
  MemoryCgroup cgroup("100M");
  if (!cgroup.missing().empty()) GTEST_SKIP() << cgroup.missing();
  // xla-spawn and its replicas in the cgroup; ordinal 1 touches 400 MiB of it.
  Launch run({"/bin/sh", "-c", "echo $$ > '" + cgroup.path() + "/cgroup.procs' && exec \"$0\" \"$@\"",
              xla_spawn_path(), "-n", "2", "--grace-period", "1", "--", helper_path(), "--for",
              "1=eat-memory:400", "--do", "sleep:30"},
             /*raw=*/true);
  const int status = run.wait_or_fail(std::chrono::seconds(60));
  ASSERT_TRUE(WIFEXITED(status)) << status << run.err();
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGKILL) << run.err();
  EXPECT_EQ(run.out().find("touched 400 MiB"), std::string::npos) << run.out();
  EXPECT_NE(run.err().find("ordinal 1 killed by signal 9 (SIGKILL: Killed), sent by the kernel's "
                           "OOM killer ("),
            std::string::npos)
      << run.err();
  // Named by the kernel log where it can be read (root), else by the cgroup's count.
  EXPECT_TRUE(run.err().find("(kernel log: Killed process ") != std::string::npos ||
              run.err().find("by its memory cgroup's count (oom_kill in ") != std::string::npos)
      << run.err();
}

// A SIGKILL sent by hand while an OOM kill happens elsewhere is not blamed on the OOM killer:
// the kernel log names the process it killed.
TEST(OomTest, TheKernelLogLineNamesTheProcess) {
  const std::string log =
      "6,1234,567;Memory cgroup out of memory: Killed process 15927 (replica_helper) "
      "total-vm:415292kB, anon-rss:96896kB\n6,1235,568;other\n";
  EXPECT_EQ(oom_kill_line(log, 15927), "Killed process 15927 (replica_helper)");
  EXPECT_EQ(oom_kill_line(log, 1592), std::nullopt);
  EXPECT_EQ(oom_kill_line(log, 4242), std::nullopt);
  EXPECT_EQ(oom_kill_line("Killed process 7 (no close paren\n", 7), std::nullopt);
}

// Counters as the kernel writes them.
TEST(OomTest, CountersAndCgroupFilesAreParsed) {
  EXPECT_EQ(parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), 3u);
  EXPECT_EQ(parse_oom_kills("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n"), 2u);
  EXPECT_EQ(parse_oom_kills("nothing here 1\n"), std::nullopt);
  EXPECT_EQ(memory_events_file("0::/../../etc\n", "/sys/fs/cgroup"), "");
  EXPECT_EQ(memory_events_file("garbage", "/sys/fs/cgroup"), "");
}

}  // namespace
}  // namespace xs::testing
