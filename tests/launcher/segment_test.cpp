// The job's shared-memory segment through xla-spawn: every replica gets its name, it exists
// while the job runs, it is gone after the job on every exit path, and a segment left by a
// SIGKILLed launcher is removed at the next start.

#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

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

void PrintTo(const ExitPath& path, std::ostream* os) { *os << path.name; }

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

INSTANTIATE_TEST_SUITE_P(
    ExitPaths, SegmentTest,
    ::testing::Values(ExitPath{"Success", "true", 0}, ExitPath{"Failure", "exit 3", 3},
                      ExitPath{"Timeout", "sleep 30", 124}),
    [](const auto& info) { return info.param.name; });

TEST(SegmentTest, SegmentOfASigkilledLauncherIsRemovedAtTheNextStart) {
  Launch run({"-n", "2", "--", "/bin/sh", "-c", std::string(kReportSegment) + "; sleep 30"});
  std::string name;
  ASSERT_TRUE(wait_until(
      [&] {
        name = segment_from(run.out());
        return !name.empty();
      },
      std::chrono::seconds(20)))
      << run.out() << run.err();
  ASSERT_EQ(::kill(run.pid(), SIGKILL), 0);
  ASSERT_TRUE(run.wait_for(std::chrono::seconds(10)).has_value());
  ASSERT_TRUE(segment_exists(name)) << "SIGKILL cannot run cleanup; the segment should remain";

  const RunResult next = run_xla_spawn({"-n", "1", "--", "true"});
  EXPECT_EQ(next.exit_code, 0) << next.err;
  EXPECT_FALSE(segment_exists(name)) << name << " survived the next start";
  EXPECT_NE(next.err.find("removed stale segment " + name), std::string::npos) << next.err;
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
