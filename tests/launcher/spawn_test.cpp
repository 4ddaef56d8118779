// spawn(fn): the calling program forked N times under the xla-spawn supervisor. Checks inside
// fn throw (a gtest EXPECT in a child would be lost); the parent sees the exit codes.

#include "xla_spawn/launcher/spawn.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/base/trace.h"
#include "xla_spawn/shm/segment.h"

namespace xs {
namespace {

// Collects every replica line in the parent via OutputOptions::on_line.
struct Captured {
  std::map<int, std::vector<std::string>> lines;
  SpawnOptions options() {
    SpawnOptions o;
    o.grace = std::chrono::milliseconds(500);
    o.output.on_line = [this](int ordinal, ReplicaStream, std::string_view line) {
      lines[ordinal].emplace_back(line);
    };
    return o;
  }
};

void expect_env(const char* name, const std::string& expected) {
  const char* value = std::getenv(name);
  if (value == nullptr || expected != value) {
    throw std::runtime_error(
        fmt::format("{}={} expected {}", name, value ? value : "<unset>", expected));
  }
}

void sleep_until_stopped() {  // bounded: the supervisor stops us long before
  for (int i = 0; i < 3000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

class SpawnTest : public ::testing::TestWithParam<int> {};

TEST_P(SpawnTest, EachChildRunsFnWithItsOrdinalAndTheReplicaEnvironment) {
  const int n = GetParam();
  Captured captured;
  const JobResult r = spawn(
      [n](int ordinal) {
        expect_env("XLA_SPAWN_ORDINAL", std::to_string(ordinal));
        expect_env("RANK", std::to_string(ordinal));
        expect_env("XLA_SPAWN_WORLD_SIZE", std::to_string(n));
        expect_env("WORLD_SIZE", std::to_string(n));
        std::printf("ran %d\n", ordinal);
      },
      n, captured.options());
  EXPECT_EQ(r.outcome, JobOutcome::kSucceeded) << r.summary;
  EXPECT_EQ(r.exit_code, 0) << r.summary;
  EXPECT_EQ(r.attempts, 1);
  ASSERT_EQ(captured.lines.size(), static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(captured.lines[k], (std::vector<std::string>{"ran " + std::to_string(k)}));
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SpawnTest, ::testing::Values(1, 2, 3, 4));

TEST(SpawnTest, ChildrenAttachTheJobsSegmentWhichIsGoneAfterwards) {
  constexpr int kWorld = 3;
  Captured captured;
  const JobResult r = spawn(
      [](int ordinal) {
        const Segment segment = Segment::attach(std::getenv("XLA_SPAWN_SEGMENT"), ordinal, kWorld,
                                                std::getenv("XLA_SPAWN_JOB_ID"));
        std::printf("%s\n", segment.name().c_str());
      },
      kWorld, captured.options());
  ASSERT_EQ(r.exit_code, 0) << r.summary;
  ASSERT_EQ(captured.lines.size(), static_cast<size_t>(kWorld));
  const std::string name = captured.lines[0].at(0);
  EXPECT_EQ(name, segment_name(r.job_id));
  EXPECT_EQ(captured.lines[2].at(0), name);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + name)) << name << " left behind";
}

// spawn(fn) merges the timeline as xla-spawn does, from XLA_SPAWN_TRACE (each child starts
// recording as xm::init() would).
TEST(SpawnTest, XlaSpawnTraceGivesOneTimelineOfTheChildren) {
  const std::string file = fmt::format("{}/xs-spawn-trace-{}.json",
                                       std::filesystem::temp_directory_path().string(), ::getpid());
  ::setenv(trace::kFileEnv, file.c_str(), 1);
  const JobResult r = spawn(
      [](int ordinal) {
        trace::start_from_env(ordinal, 0);
        TraceScope span("user span");
      },
      2);
  ::unsetenv(trace::kFileEnv);
  EXPECT_EQ(r.exit_code, 0) << r.summary;
  std::ifstream in(file);
  const std::string json{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::filesystem::remove(file);
  EXPECT_NE(json.find("\"args\":{\"name\":\"ordinal 0\"}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"args\":{\"name\":\"ordinal 1\"}"), std::string::npos) << json;
  EXPECT_EQ(std::count(json.begin(), json.end(), 'X'), 2) << json;  // "ph":"X" twice
  EXPECT_FALSE(std::filesystem::exists(trace::part_path(file, r.job_id, 0, 0)));
}

TEST(SpawnFailureTest, ThrowingChildExitsOneAndTheSummaryCarriesWhat) {
  Captured captured;
  const JobResult r = spawn(
      [](int ordinal) {
        if (ordinal == 1) throw std::runtime_error("boom in ordinal 1");
        sleep_until_stopped();
      },
      3, captured.options());
  EXPECT_EQ(r.outcome, JobOutcome::kFailed);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.failed_ordinal, 1);
  EXPECT_NE(r.summary.find("spawn: ordinal 1 threw: boom in ordinal 1"), std::string::npos)
      << r.summary;
  EXPECT_NE(r.summary.find("stopped by xla-spawn (not failures): ordinal(s) 0, 2"),
            std::string::npos)
      << r.summary;
}

// The others are stopped while the last of them may be just forked: a SIGTERM reaching a child
// before it reset the supervisor's handlers used to land in the supervisor's own signal pipe
// (a job "interrupted", the child not stopped: "SIGKILL needed"). Seen in a loaded CI run.
TEST(SpawnFailureTest, StoppingChildrenJustForkedNeverReachesTheSupervisor) {
  for (int round = 0; round < 20; ++round) {
    Captured captured;
    // A long grace period: a child the loaded machine has not yet run for half a second is
    // no failure of the handler; one that never heard the SIGTERM needs the SIGKILL still.
    SpawnOptions options = captured.options();
    options.grace = std::chrono::seconds(10);
    const JobResult r = spawn(
        [](int ordinal) {
          if (ordinal == 0) throw std::runtime_error("boom");
          sleep_until_stopped();
        },
        8, options);
    ASSERT_EQ(r.outcome, JobOutcome::kFailed) << "round " << round << ": " << r.summary;
    ASSERT_EQ(r.summary.find("SIGKILL needed"), std::string::npos)
        << "round " << round << ": " << r.summary;
  }
}

TEST(SpawnFailureTest, ExitCodeAndSignalOfTheRootCausePropagate) {
  Captured a;
  const JobResult exited = spawn(
      [](int ordinal) {
        if (ordinal == 0) ::_exit(9);
      },
      2, a.options());
  EXPECT_EQ(exited.exit_code, 9);
  EXPECT_EQ(exited.failed_ordinal, 0);
  Captured b;
  const JobResult killed = spawn(
      [](int ordinal) {
        if (ordinal == 1) ::raise(SIGKILL);
        sleep_until_stopped();
      },
      2, b.options());
  EXPECT_EQ(killed.exit_code, 128 + SIGKILL);
  EXPECT_NE(killed.summary.find("SIGKILL"), std::string::npos) << killed.summary;
}

TEST(SpawnFailureTest, TimeoutStopsTheJob) {
  Captured captured;
  SpawnOptions options = captured.options();
  options.timeout = std::chrono::milliseconds(300);
  const JobResult r = spawn([](int) { sleep_until_stopped(); }, 2, options);
  EXPECT_EQ(r.outcome, JobOutcome::kTimedOut);
  EXPECT_EQ(r.exit_code, 124);
}

TEST(SpawnTest, UnflushedParentOutputIsNotDuplicatedIntoChildren) {
  std::printf("pending-before-spawn ");  // no newline: sits in the stdio buffer
  Captured captured;
  const JobResult r = spawn([](int) { std::printf("child\n"); }, 2, captured.options());
  std::printf("\n");
  EXPECT_EQ(r.exit_code, 0) << r.summary;
  for (const auto& [ordinal, lines] : captured.lines) {
    EXPECT_EQ(lines, (std::vector<std::string>{"child"})) << "ordinal " << ordinal;
  }
}

// Records the calls the supervisor makes through the JobResources seam.
class RecordingResources : public JobResources {
 public:
  std::vector<EnvVar> prepare(const std::string& job_id, int world_size, int attempt) override {
    calls.push_back(fmt::format("prepare {} {}", world_size, attempt));
    job_ids.push_back(job_id);
    return {{"XLA_SPAWN_SEGMENT", fmt::format("/seg-{}", attempt)}};
  }
  void release() noexcept override { calls.emplace_back("release"); }
  std::vector<std::string> calls;
  std::vector<std::string> job_ids;
};

TEST(SpawnResourcesTest, PreparedBeforeEachAttemptAndReleasedAfterIt) {
  RecordingResources resources;
  Captured captured;
  SpawnOptions options = captured.options();
  options.resources = &resources;
  options.max_restarts = 1;
  const JobResult r = spawn(
      [](int ordinal) {
        const std::string attempt = std::getenv("XLA_SPAWN_ATTEMPT");
        expect_env("XLA_SPAWN_SEGMENT", "/seg-" + attempt);
        if (ordinal == 1 && attempt == "0") ::_exit(3);
      },
      2, options);
  EXPECT_EQ(r.exit_code, 0) << r.summary;
  EXPECT_EQ(r.attempts, 2);
  EXPECT_EQ(resources.calls,
            (std::vector<std::string>{"prepare 2 0", "release", "prepare 2 1", "release"}));
  ASSERT_EQ(resources.job_ids.size(), 2u);
  EXPECT_EQ(resources.job_ids[0], resources.job_ids[1]) << "one job id across attempts";
  EXPECT_EQ(resources.job_ids[0], r.job_id);
}

TEST(SpawnResourcesTest, ReleasedWhenTheSupervisorIsInterrupted) {
  RecordingResources resources;
  Captured captured;
  SpawnOptions options = captured.options();
  options.resources = &resources;
  const JobResult r = spawn(
      [](int ordinal) {
        if (ordinal == 0) ::kill(::getppid(), SIGINT);  // as if Ctrl-C hit the supervisor
        sleep_until_stopped();
      },
      2, options);
  EXPECT_EQ(r.outcome, JobOutcome::kInterrupted) << r.summary;
  EXPECT_EQ(r.exit_code, 130);
  EXPECT_EQ(resources.calls, (std::vector<std::string>{"prepare 2 0", "release"}));
}

TEST(SpawnResourcesTest, InvalidArgumentsThrowBeforeForking) {
  RecordingResources resources;
  SpawnOptions options;
  options.resources = &resources;
  EXPECT_THROW(spawn([](int) {}, 0, options), InvalidArgument);
  EXPECT_THROW(spawn([](int) {}, 2000, options), InvalidArgument);
  EXPECT_TRUE(resources.calls.empty());
}

TEST(SpawnTest, ExitStatusesSurviveACallerThatIgnoresSigchld) {
  // With SIGCHLD ignored the kernel would reap children itself; spawn must still see codes.
  struct sigaction ignore {};
  struct sigaction previous {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGCHLD, &ignore, &previous);
  Captured captured;
  const JobResult r = spawn(
      [](int ordinal) {
        if (ordinal == 1) ::_exit(6);
      },
      2, captured.options());
  struct sigaction after {};
  ::sigaction(SIGCHLD, &previous, &after);
  EXPECT_EQ(r.exit_code, 6) << r.summary;
  EXPECT_EQ(after.sa_handler, SIG_IGN) << "the caller's disposition is restored";
}

}  // namespace
}  // namespace xs
