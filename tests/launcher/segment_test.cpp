// The job's shared-memory segment through xla-spawn: every replica gets its name, it exists
// while the job runs, it is gone after the job on every exit path, and a segment left by a
// SIGKILLed launcher is removed by its reaper (or, when the reaper is killed too, at the next
// start).

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "xla_spawn/shm/layout.h"
#include "tests/launcher/launch_support.h"

namespace xs::testing {
namespace {

// "SEG <name>" printed by a replica that found its segment under /dev/shm.
constexpr const char* kReportSegment =
    R"(test -e "/dev/shm$XLA_SPAWN_SEGMENT" && echo "SEG $XLA_SPAWN_SEGMENT")";

// The segment named by the first replica that reported it (on the failure paths the others
// may be stopped before they print).
std::string segment_from(const std::string& out) {
  for (const std::string& line : lines_with(out, "[")) {
    const size_t at = line.find("] SEG ");
    if (at != std::string::npos) return line.substr(at + 6);
  }
  return "";
}

bool segment_exists(const std::string& name) {
  return std::filesystem::exists("/dev/shm" + name);
}

struct ExitPath {
  std::string name;
  std::string script;  // after the segment report
  int exit_code;
};

void PrintTo(const ExitPath& path, std::ostream* os) {
  *os << path.name;
}

class SegmentTest : public ::testing::TestWithParam<ExitPath> {};

TEST_P(SegmentTest, ReplicasSeeTheSegmentAndItIsGoneAfterTheJob) {
  const ExitPath& path = GetParam();
  const RunResult r = run_xla_spawn({"-n", "2", "--timeout", "2", "--", "/bin/sh", "-c",
                                     std::string(kReportSegment) + "; " + path.script});
  EXPECT_EQ(r.exit_code, path.exit_code) << r.err;
  const std::string name = segment_from(r.out);
  ASSERT_EQ(name.rfind("/xla-spawn-", 0), 0u) << "no replica reported a segment:\n" << r.out;
  // On the failure paths a replica may be stopped before it reports.
  if (path.exit_code == 0) {
    EXPECT_EQ(lines_with(r.out, "[0] SEG " + name).size(), 1u) << "one segment per job\n" << r.out;
    EXPECT_EQ(lines_with(r.out, "[1] SEG " + name).size(), 1u) << "one segment per job\n" << r.out;
  }
  EXPECT_FALSE(segment_exists(name)) << name << " left behind";
}

INSTANTIATE_TEST_SUITE_P(ExitPaths, SegmentTest,
                         ::testing::Values(ExitPath{"Success", "true", 0},
                                           ExitPath{"Failure", "exit 3", 3},
                                           ExitPath{"Timeout", "sleep 30", 124}),
                         [](const auto& info) { return info.param.name; });

// The pid of the launcher's reaper (launcher/reaper.h): its child named "xla-spawn-reap".
pid_t reaper_of(pid_t launcher) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(entry.path().string() + "/stat");
    const size_t close = stat.rfind(')');
    if (stat.find("(xla-spawn-reap)") == std::string::npos || close == std::string::npos) continue;
    int ppid = 0;
    char state = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == launcher) {
      return static_cast<pid_t>(std::stol(pid));
    }
  }
  return -1;
}

std::string started_segment(Launch& run) {
  std::string name;
  wait_until(
      [&] {
        name = segment_from(run.out());
        return !name.empty();
      },
      std::chrono::seconds(20));
  return name;
}

TEST(SegmentTest, SegmentOfASigkilledLauncherIsRemovedByItsReaper) {
  Launch run({"-n", "2", "--", "/bin/sh", "-c", std::string(kReportSegment) + "; sleep 30"});
  const std::string name = started_segment(run);
  ASSERT_FALSE(name.empty()) << run.out() << run.err();
  ASSERT_EQ(::kill(run.pid(), SIGKILL), 0);
  ASSERT_TRUE(run.wait_for(std::chrono::seconds(10)).has_value());
  EXPECT_TRUE(wait_until([&] { return !segment_exists(name); }, std::chrono::seconds(10)))
      << name << " survived its launcher's SIGKILL";
  EXPECT_TRUE(wait_until([&] { return run.err().find("xla-spawn reaper:") != std::string::npos; },
                         std::chrono::seconds(10)))
      << run.err();
}

// SIGKILLs `reaper`, then `run`'s launcher, which is stopped first: left running between the
// two kills, it would start a new reaper (it checks every 200 ms), which cleans up.
void kill_reaper_then_launcher(const Launch& run, pid_t reaper) {
  ASSERT_EQ(::kill(run.pid(), SIGSTOP), 0);
  ASSERT_TRUE(wait_until([&] { return process_state(run.pid()) == 'T'; }, std::chrono::seconds(10)));
  ASSERT_EQ(::kill(reaper, SIGKILL), 0);
  ASSERT_EQ(::kill(run.pid(), SIGKILL), 0);
}

TEST(SegmentTest, SegmentLeftWhenTheReaperDiesTooIsRemovedAtTheNextStart) {
  Launch run({"-n", "2", "--", "/bin/sh", "-c", std::string(kReportSegment) + "; sleep 30"});
  const std::string name = started_segment(run);
  ASSERT_FALSE(name.empty()) << run.out() << run.err();
  const pid_t reaper = reaper_of(run.pid());
  ASSERT_GT(reaper, 0) << "no reaper process under launcher " << run.pid();
  ASSERT_NO_FATAL_FAILURE(kill_reaper_then_launcher(run, reaper));
  ASSERT_TRUE(run.wait_for(std::chrono::seconds(10)).has_value());
  ASSERT_TRUE(segment_exists(name)) << "with launcher and reaper SIGKILLed, the segment remains";

  const RunResult next = run_xla_spawn({"-n", "1", "--", "true"});
  EXPECT_EQ(next.exit_code, 0) << next.err;
  EXPECT_FALSE(segment_exists(name)) << name << " survived the next start";
  EXPECT_NE(next.err.find("removed stale segment " + name), std::string::npos) << next.err;
}

// A process of the test's that started at least 50 ms (5 clock ticks of start time) before
// whatever the test starts next, and is killed and reaped with the guard.
class EarlierProcess {
 public:
  EarlierProcess() : pid_(::fork()) {
    if (pid_ == 0) {
      ::pause();
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ~EarlierProcess() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  EarlierProcess(const EarlierProcess&) = delete;
  EarlierProcess& operator=(const EarlierProcess&) = delete;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

// A stale segment whose launcher's pid now belongs to another live process (pid reuse) is
// still stale: the launcher is known by pid and start time. The stand-in for the pid's new
// owner started well before the launcher: start times count 10 ms ticks, and the test itself,
// which starts the launcher at once, often shares the launcher's tick on a fast machine.
TEST(SegmentTest, SegmentWhoseLauncherPidWasReusedIsRemovedAtTheNextStart) {
  const EarlierProcess stand_in;
  ASSERT_GT(stand_in.pid(), 0) << "fork failed";
  Launch run({"-n", "2", "--", "/bin/sh", "-c", std::string(kReportSegment) + "; sleep 30"});
  const std::string name = started_segment(run);
  ASSERT_FALSE(name.empty()) << run.out() << run.err();
  const pid_t reaper = reaper_of(run.pid());
  ASSERT_GT(reaper, 0) << "no reaper process under launcher " << run.pid();
  ASSERT_NO_FATAL_FAILURE(kill_reaper_then_launcher(run, reaper));
  ASSERT_TRUE(run.wait_for(std::chrono::seconds(10)).has_value());
  ASSERT_TRUE(segment_exists(name)) << "with launcher and reaper SIGKILLed, the segment remains";
  {
    const int fd = ::open(("/dev/shm" + name).c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    ASSERT_GE(fd, 0) << name;
    void* base = ::mmap(nullptr, sizeof(shm::ControlBlock), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    ASSERT_NE(base, MAP_FAILED);
    static_cast<shm::ControlBlock*>(base)->launcher_pid = static_cast<int32_t>(stand_in.pid());
    ::munmap(base, sizeof(shm::ControlBlock));
  }
  const RunResult next = run_xla_spawn({"-n", "1", "--", "true"});
  EXPECT_EQ(next.exit_code, 0) << next.err;
  EXPECT_FALSE(segment_exists(name)) << name << " (its pid now a live process's) survived the next start";
  EXPECT_NE(next.err.find("removed stale segment " + name), std::string::npos) << next.err;
}

// Replica script of the cleanup tests: reports the segment, starts `sleep 30` in its group,
// writes that sleep's pid to DIR/pid.$RANK (whole, by a rename) and waits for it.
std::string sleeping_replica(const TempDir& dir) {
  return std::string(kReportSegment) + "; sleep 30 & echo $! > " + dir.path() + "/pid.$RANK.tmp; mv " +
         dir.path() + "/pid.$RANK.tmp " + dir.path() + "/pid.$RANK; wait";
}

bool sleeps_started(const TempDir& dir) {
  return std::filesystem::exists(dir / "pid.0") && std::filesystem::exists(dir / "pid.1");
}

// Both ordinals' sleeps end within 10 s; `what` says how one survived.
void expect_sleeps_die(const TempDir& dir, const std::string& what) {
  for (const char* k : {"0", "1"}) {
    const pid_t sleep_pid = static_cast<pid_t>(std::stol(read_file(dir / ("pid." + std::string(k)))));
    EXPECT_TRUE(wait_until([&] { return !process_alive(sleep_pid); }, std::chrono::seconds(10)))
        << "the sleep of ordinal " << k << " " << what;
  }
}

// `setsid xla-spawn ... & kill -9 -- -$!`: SIGKILL to the launcher's whole process group still
// leaves the reaper, which kills what the replicas started and removes the segment.
TEST(SegmentTest, KillingTheLaunchersWholeGroupStillCleansUp) {
  TempDir dir;
  const std::string script = sleeping_replica(dir);
  Launch run({"/usr/bin/setsid", xla_spawn_path(), "-n", "2", "--", "/bin/sh", "-c", script}, true);
  const std::string name = started_segment(run);
  ASSERT_FALSE(name.empty()) << run.out() << run.err();
  ASSERT_TRUE(wait_until([&] { return sleeps_started(dir); }, std::chrono::seconds(20)));
  ASSERT_EQ(::getpgid(run.pid()), run.pid()) << "setsid made xla-spawn a group leader";
  ASSERT_EQ(::kill(-run.pid(), SIGKILL), 0);
  ASSERT_TRUE(run.wait_for(std::chrono::seconds(10)).has_value());
  EXPECT_TRUE(wait_until([&] { return !segment_exists(name); }, std::chrono::seconds(10)))
      << name << " survived the SIGKILL of its launcher's process group";
  expect_sleeps_die(dir, "outlived its launcher's process group");
}

// A reaper killed on its own is replaced, with a warning, and the new one does the old one's
// work when the launcher is SIGKILLed afterwards.
TEST(SegmentTest, AKilledReaperIsReplacedAndTheNewOneCleansUp) {
  TempDir dir;
  const std::string script = sleeping_replica(dir);
  Launch run({"-n", "2", "--", "/bin/sh", "-c", script});
  const std::string name = started_segment(run);
  ASSERT_FALSE(name.empty()) << run.out() << run.err();
  ASSERT_TRUE(wait_until([&] { return sleeps_started(dir); }, std::chrono::seconds(20)));
  const pid_t old = reaper_of(run.pid());
  ASSERT_GT(old, 0) << "no reaper process under launcher " << run.pid();
  ASSERT_EQ(::kill(old, SIGKILL), 0);
  EXPECT_TRUE(wait_until([&] {
    const pid_t now = reaper_of(run.pid());
    return now > 0 && now != old && process_alive(now);
  }, std::chrono::seconds(5))) << run.err();
  EXPECT_TRUE(wait_until([&] { return run.err().find(fmt::format("the reaper (pid {}) died", old)) != std::string::npos; },
                         std::chrono::seconds(5)))
      << run.err();
  ASSERT_EQ(::kill(run.pid(), SIGKILL), 0);
  ASSERT_TRUE(run.wait_for(std::chrono::seconds(10)).has_value());
  EXPECT_TRUE(wait_until([&] { return !segment_exists(name); }, std::chrono::seconds(10)))
      << name << " survived its launcher with the replacement reaper";
  expect_sleeps_die(dir, "outlived its launcher with the replacement reaper");
}

TEST(SegmentTest, TwoJobsAtOnceGetDifferentSegments) {
  Launch a({"-n", "1", "--", "/bin/sh", "-c", std::string(kReportSegment) + "; sleep 2"});
  const RunResult b = run_xla_spawn({"-n", "1", "--", "/bin/sh", "-c", kReportSegment});
  ASSERT_EQ(WEXITSTATUS(a.wait_or_fail(std::chrono::seconds(30))), 0) << a.err();
  const std::string name_a = segment_from(a.out());
  const std::string name_b = segment_from(b.out);
  ASSERT_FALSE(name_a.empty()) << a.out();
  ASSERT_FALSE(name_b.empty()) << b.out;
  EXPECT_NE(name_a, name_b);
}

}  // namespace
}  // namespace xs::testing
