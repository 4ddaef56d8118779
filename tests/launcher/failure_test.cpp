// Fail fast: the first replica to fail is the root cause, the others are stopped within the
// grace period (+0.5 s), the summary names the root cause, and its exit code or signal
// becomes xla-spawn's exit status. Also --timeout and --max-restarts.

#include <sys/wait.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/launcher/launch_support.h"
#include "tests/support/deadline_scale.h"

namespace xs::testing {
namespace {

constexpr int kWorld = 4;

struct StopCase {
  int failing_ordinal;
  const char* others;  // the other replicas' action
};

class FailFastTest : public ::testing::TestWithParam<StopCase> {};

// Measured from the failure (the helper's CLOCK_MONOTONIC stamp just before it exits) to the
// moment xla-spawn has reaped everyone and exited.
TEST_P(FailFastTest, FailureOfOrdinalKStopsEveryOtherReplicaWithinTheGracePeriod) {
  const StopCase c = GetParam();
  constexpr double kGraceSeconds = 1.0;
  TempDir dir;
  const std::string k = std::to_string(c.failing_ordinal);
  Launch run({"-n", std::to_string(kWorld), "--grace-period", "1", "--", helper_path(), "--pid-dir",
              dir.path(), "--wait-peers", "--do", c.others, "--for", k + "=exit:3"});
  const int status = run.wait_or_fail(std::chrono::seconds(60));
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 3) << run.err();
  const std::string fail_stamp = read_file(dir / ("fail." + k));
  ASSERT_FALSE(fail_stamp.empty()) << run.err();
  const auto failed_at = Clock::time_point(std::chrono::nanoseconds(std::stoll(fail_stamp)));
  const double stop_seconds = std::chrono::duration<double>(run.exit_time() - failed_at).count();
  // The grace period is the launcher's own timer; the margin on top is for processes to run
  // and exit on a loaded machine, which instrumented builds stretch (deadline_scale.h). The
  // replicas would sleep for 30 s.
  EXPECT_LE(stop_seconds, kGraceSeconds + 3.0 * static_cast<double>(deadline_scale())) << run.err();
  for (pid_t pid : wait_for_pids(dir.path(), kWorld, std::chrono::seconds(1))) {
    EXPECT_FALSE(process_alive(pid)) << "replica pid " << pid << " outlived xla-spawn";
  }
  const std::string err = run.err();
  EXPECT_NE(err.find("failed after"), std::string::npos) << err;
  EXPECT_NE(err.find(": ordinal " + k + " exited with code 3"), std::string::npos) << err;
  EXPECT_NE(err.find("stopped by xla-spawn (not failures)"), std::string::npos) << err;
  if (std::strcmp(c.others, "ignore-term:30") == 0) {
    EXPECT_NE(err.find("SIGKILL needed for"), std::string::npos) << err;  // after the grace
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, FailFastTest,
                         ::testing::Values(StopCase{0, "sleep:30"}, StopCase{2, "sleep:30"},
                                           StopCase{3, "ignore-term:30"},
                                           StopCase{1, "ignore-term:30"}),
                         [](const auto& info) {
                           return "Ordinal" + std::to_string(info.param.failing_ordinal) +
                                  (std::strcmp(info.param.others, "sleep:30") == 0
                                       ? "OthersObeySigterm"
                                       : "OthersIgnoreSigterm");
                         });

TEST(FailFastTest, StoppedReplicasNeedingSigkillAreListedAsStopped) {
  TempDir dir;  // --wait-peers: nobody fails before every replica ignores SIGTERM
  const RunResult r =
      run_xla_spawn({"-n", "3", "--grace-period", "0.5", "--", helper_path(), "--pid-dir",
                     dir.path(), "--wait-peers", "--do", "ignore-term:30", "--for", "1=exit:7"});
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_NE(r.err.find("ordinal(s) 0, 2; SIGKILL needed for 0, 2"), std::string::npos) << r.err;
}

TEST(FailFastTest, StopReachesTheReplicasOwnChildren) {
  TempDir dir;
  // Ordinals 0 and 2 start a child (sleep) and wait; ordinal 1 fails once both are up.
  const std::string script =
      "if [ $RANK = 1 ]; then while [ ! -s " + dir.path() + "/pid.0 ] || [ ! -s " + dir.path() +
      "/pid.2 ]; do sleep 0.01; done; exit 4; fi; sleep 30 & echo $! > " + dir.path() +
      "/pid.$RANK.tmp; mv " + dir.path() + "/pid.$RANK.tmp " + dir.path() + "/pid.$RANK; wait";
  Launch run({"-n", "3", "--grace-period", "5", "--", "/bin/sh", "-c", script});
  const int status = run.wait_or_fail(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 4) << run.err();
  for (const char* k : {"0", "2"}) {
    const pid_t grandchild =
        static_cast<pid_t>(std::stol(read_file(dir / ("pid." + std::string(k)))));
    EXPECT_TRUE(wait_until([&] { return !process_alive(grandchild); }, std::chrono::seconds(1)))
        << "the sleep started by ordinal " << k << " survived the stop";
  }
  EXPECT_EQ(run.err().find("SIGKILL needed"), std::string::npos) << "SIGTERM to the group suffices";
}

// A replica that exits, successfully or not, while something it started in the background
// still runs (even ignoring SIGTERM): the background process dies with it, not after the job.
TEST(FailFastTest, WhatAReplicaLeftRunningDiesWithIt) {
  for (const char* code : {"0", "3"}) {
    TempDir dir;
    // Each replica exits once both have started their sleep (so a failure cannot stop the
    // other first); --timeout bounds the wait.
    const std::string d = dir.path();
    const std::string script = "trap '' TERM; (trap '' TERM; exec sleep 300) & echo $! > " + d + "/pid.$RANK.tmp; mv " +
                               d + "/pid.$RANK.tmp " + d + "/pid.$RANK; while [ ! -s " + d + "/pid.0 ] || [ ! -s " + d +
                               "/pid.1 ]; do sleep 0.01; done; exit " + code;
    const RunResult r = run_xla_spawn({"-n", "2", "--timeout", "30", "--", "/bin/sh", "-c", script});
    EXPECT_EQ(r.exit_code, std::stoi(code)) << r.err;
    for (const char* k : {"0", "1"}) {
      const pid_t background = static_cast<pid_t>(std::stol(read_file(dir / ("pid." + std::string(k)))));
      EXPECT_TRUE(wait_until([&] { return !process_alive(background); }, std::chrono::seconds(2)))
          << "the sleep ordinal " << k << " started outlived a job that ended with " << code;
    }
  }
}

// Out of the replica's group too: a `setsid` child comes back to xla-spawn (its subreaper) when
// the replica exits, and is killed after the attempt.
TEST(FailFastTest, WhatAReplicaStartedInASessionOfItsOwnDiesWithTheJob) {
  TempDir dir;
  const std::string d = dir.path();
  const std::string script = "/usr/bin/setsid sleep 300 & echo $! > " + d + "/pid.$RANK.tmp; mv " + d +
                             "/pid.$RANK.tmp " + d + "/pid.$RANK; exit 0";
  const RunResult r = run_xla_spawn({"-n", "2", "--timeout", "30", "--", "/bin/sh", "-c", script});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* k : {"0", "1"}) {
    const pid_t escaped = static_cast<pid_t>(std::stol(read_file(dir / ("pid." + std::string(k)))));
    EXPECT_TRUE(wait_until([&] { return !process_alive(escaped); }, std::chrono::seconds(2)))
        << "the setsid sleep of ordinal " << k << " outlived the job";
  }
}

class ExitCodeTest : public ::testing::TestWithParam<int> {};

TEST_P(ExitCodeTest, RootCauseExitCodeBecomesTheExitStatus) {
  const int code = GetParam();
  const RunResult r = run_xla_spawn({"-n", "3", "--", helper_path(), "--do", "sleep:30", "--for",
                                     "1=exit:" + std::to_string(code)});
  EXPECT_EQ(r.exit_code, code) << r.err;
  EXPECT_NE(r.err.find("ordinal 1 exited with code " + std::to_string(code)), std::string::npos)
      << r.err;
}

INSTANTIATE_TEST_SUITE_P(Codes, ExitCodeTest, ::testing::Values(1, 3, 42, 255));

class SignalDeathTest : public ::testing::TestWithParam<int> {};

TEST_P(SignalDeathTest, RootCauseSignalBecomes128PlusSignalAndIsNamed) {
  const int signo = GetParam();
  const RunResult r = run_xla_spawn({"-n", "3", "--", helper_path(), "--do", "sleep:30", "--for",
                                     "2=signal:" + std::to_string(signo)});
  EXPECT_EQ(r.exit_code, 128 + signo) << r.err;
  const std::string name = std::string("SIG") + sigabbrev_np(signo);
  EXPECT_NE(r.err.find("ordinal 2 killed by signal " + std::to_string(signo) + " (" + name),
            std::string::npos)
      << r.err;
}

INSTANTIATE_TEST_SUITE_P(Signals, SignalDeathTest,
                         ::testing::Values(SIGKILL, SIGSEGV, SIGABRT, SIGTERM),
                         [](const auto& info) { return std::string(sigabbrev_np(info.param)); });

// A replica killed by a signal and a peer that then exits with code 1 (as a PeerFailure does),
// both reaped in one wake-up of xla-spawn (here: it is stopped while both exit): the signal
// death is the root cause, although the exit has the lower ordinal.
TEST(FailFastTest, SignalDeathIsTheRootCauseBeforeAPeersExitReapedWithIt) {
  TempDir dir;
  Launch run({"-n", "2", "--", helper_path(), "--pid-dir", dir.path(), "--for", "0=exit-on-term:30",
              "--do", "sleep:30"});
  const std::vector<pid_t> pids = wait_for_pids(dir.path(), 2, std::chrono::seconds(20));
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(run.pid(), SIGSTOP), 0);
  // kill() returns before the stop takes hold: xla-spawn could still reap ordinal 0's exit on
  // its own (seen once in a clean-clone CI run).
  ASSERT_TRUE(
      wait_until([&] { return process_state(run.pid()) == 'T'; }, std::chrono::seconds(20)));
  ASSERT_EQ(::kill(pids[0], SIGTERM), 0);  // ordinal 0: exit code 1, the lower ordinal
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  const bool both_exited = wait_until(
      [&] { return !process_alive(pids[0]) && !process_alive(pids[1]); }, std::chrono::seconds(20));
  ASSERT_EQ(::kill(run.pid(), SIGCONT), 0);
  ASSERT_TRUE(both_exited);
  const int status = run.wait_or_fail(std::chrono::seconds(20));
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGKILL) << run.err();
  EXPECT_NE(run.err().find("failed after"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find(": ordinal 1 killed by signal 9"), std::string::npos) << run.err();
}

// A replica SIGKILLed with threads and memory to free is a zombie before it is reapable; a
// peer that sees it gone exits with code 1 meanwhile and is reaped first. The killed one is
// still the root cause (it died first, and not by xla-spawn's hand).
TEST(FailFastTest, AReplicaStillDyingWhenAPeerFailsIsTheRootCause) {
  for (int round = 0; round < 3; ++round) {
    TempDir dir;
    Launch run({"-n", "2", "--", helper_path(), "--pid-dir", dir.path(), "--for",
                "0=exit-when-gone:1:60", "--for", "1=slow-death:1024:60"});
    const std::vector<pid_t> pids = wait_for_pids(dir.path(), 2, std::chrono::seconds(20));
    ASSERT_EQ(pids.size(), 2u);
    ASSERT_TRUE(wait_until([&] { return std::filesystem::exists(dir.path() + "/ready.1"); },
                           std::chrono::seconds(60)));
    ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
    const int status = run.wait_or_fail(std::chrono::seconds(60));
    ASSERT_TRUE(WIFEXITED(status)) << status;
    EXPECT_EQ(WEXITSTATUS(status), 128 + SIGKILL) << "round " << round << ":\n" << run.err();
    EXPECT_NE(run.err().find(": ordinal 1 killed by signal 9"), std::string::npos) << run.err();
    // Ordinal 0 may be listed as stopped (when ordinal 1 became reapable first), never 1.
    EXPECT_EQ(run.err().find("stopped by xla-spawn (not failures): ordinal(s) 1"), std::string::npos)
        << run.err();
  }
}

TEST(FailFastTest, AllSucceedingExitsZeroWithoutSummary) {
  const RunResult r = run_xla_spawn({"-n", "4", "--", helper_path(), "--do", "exit:0"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.err, "");
}

TEST(TimeoutTest, JobTimeoutStopsEveryoneAndExits124) {
  TempDir dir;
  Launch run({"-n", "3", "--timeout", "1", "--grace-period", "1", "--", helper_path(), "--pid-dir",
              dir.path(), "--do", "sleep:60", "--for", "1=ignore-term:60"});
  const int status = run.wait_or_fail(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 124) << run.err();
  EXPECT_NE(run.err().find("timed out (--timeout 1 s)"), std::string::npos) << run.err();
  for (pid_t pid : wait_for_pids(dir.path(), 3, std::chrono::seconds(1))) {
    EXPECT_FALSE(process_alive(pid)) << pid;
  }
}

// When --timeout expires the job's state is reported before the stop: a replica stopped
// (SIGSTOP) is named by its state, where before only "timed out" was said.
TEST(TimeoutTest, AnExpiredTimeoutReportsWhatEachReplicaWasDoing) {
  TempDir dir;
  Launch run({"-n", "2", "--timeout", "2", "--grace-period", "1", "--", helper_path(),
              "--pid-dir", dir.path(), "--do", "sleep:60"});
  const std::vector<pid_t> pids = wait_for_pids(dir.path(), 2, std::chrono::seconds(20));
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(pids[1], SIGSTOP), 0);
  const int status = run.wait_or_fail(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 124) << run.err();
  EXPECT_NE(run.err().find("hang report (--timeout expired):"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find(fmt::format("ordinal 1 (pid {}, stopped)", pids[1])), std::string::npos)
      << run.err();
  for (pid_t pid : pids) EXPECT_FALSE(process_alive(pid)) << pid;
}

TEST(RestartTest, ReplicaFailingOnAttemptZeroSucceedsAfterOneRestart) {
  const RunResult r = run_xla_spawn({"-n", "3", "--max-restarts", "1", "--", helper_path(), "--do",
                                     "exit:0", "--for", "1=fail-attempts:1:3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[1] attempt 0: fail"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[1] attempt 1: ok"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("restarting all 3 replica(s): attempt 1"), std::string::npos) << r.err;
}

// Every attempt keeps the job id; the restart count follows the attempt, in both spellings.
TEST(RestartTest, EachAttemptKeepsTheJobIdAndCountsItsRestarts) {
  const RunResult r = run_xla_spawn({"-n", "2", "--max-restarts", "2", "--", helper_path(), "--do",
                                     "exit:0", "--for", "0=fail-attempts:2:3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = lines_with(r.out, "[0] restart count ");
  ASSERT_EQ(lines.size(), 3u) << r.out;
  const std::string job = lines[0].substr(lines[0].find(" of job ") + 8);
  EXPECT_EQ(job.rfind("xs-", 0), 0u) << lines[0];
  for (int attempt = 0; attempt < 3; ++attempt) {
    EXPECT_EQ(lines[attempt], fmt::format("[0] restart count {} of job {}", attempt, job));
    EXPECT_NE(r.out.find(fmt::format("[0] attempt {}: {}", attempt, attempt < 2 ? "fail" : "ok")),
              std::string::npos)
        << r.out;
  }
}

// --timeout bounds the whole job, restarts included: attempts failing after 0.7 s each would
// go on for 7.7 s under --max-restarts 10.
TEST(RestartTest, TheJobTimeoutCoversTheRestarts) {
  const auto start = Clock::now();
  const RunResult r = run_xla_spawn({"-n", "1", "--timeout", "2", "--max-restarts", "10", "--",
                                     "/bin/sh", "-c", "sleep 0.7; exit 3"});
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 124) << r.err;
  // Said of the whole job, not only of the last attempt's fraction of a second.
  EXPECT_NE(r.err.find("timed out (--timeout 2 s, the whole job) during attempt "),
            std::string::npos)
      << r.err;
  EXPECT_LT(took, 6.0) << r.err;
}

// The summary shows the root cause's last 20 lines, not more.
TEST(SummaryTest, ShowsTheLastTwentyLinesOfTheRootCause) {
  const RunResult r = run_xla_spawn(
      {"-n", "1", "--", "/bin/sh", "-c", "for i in $(seq 1 30); do echo line $i; done; exit 3"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("last 20 line(s) of ordinal 0:\n  [0] line 11\n"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("  [0] line 30\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("  [0] line 10\n"), std::string::npos) << r.err;
}

// "failed after" is the time to the failure, not to the end of the grace period that the
// others took; a root cause that printed nothing is said so, without an empty heading.
TEST(SummaryTest, TheFailureTimeLeavesOutTheGracePeriodAndSilenceIsNamed) {
  TempDir dir;
  // Ordinal 0 fails once ordinal 1 ignores SIGTERM (at most 10 s).
  const std::string ready = dir / "ready";
  const RunResult r = run_xla_spawn(
      {"-n", "2", "--grace-period", "2", "--", "/bin/sh", "-c",
       fmt::format("if [ \"$RANK\" = 0 ]; then for i in $(seq 1000); do [ -e {0} ] && exit 3; "
                   "sleep 0.01; done; exit 4; fi; trap '' TERM; touch {0}; sleep 30",
                   ready)});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_GE(r.seconds, 2.0) << r.err;
  const size_t at = r.err.find("attempt 0 failed after ");
  ASSERT_NE(at, std::string::npos) << r.err;
  const double failed_after = std::stod(r.err.substr(at + 23));
  EXPECT_LT(failed_after, 1.9) << r.err;
  EXPECT_NE(r.err.find("xla-spawn: ordinal 0 printed nothing\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("last 0 line(s)"), std::string::npos) << r.err;
}

TEST(RestartTest, WithoutRestartsTheFirstFailureIsFinal) {
  const RunResult r = run_xla_spawn(
      {"-n", "2", "--", helper_path(), "--do", "exit:0", "--for", "1=fail-attempts:1:3"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_EQ(r.err.find("restarting"), std::string::npos) << r.err;
}

TEST(RestartTest, GivesUpAfterMaxRestartsWithTheLastFailure) {
  const RunResult r = run_xla_spawn({"-n", "2", "--max-restarts", "2", "--", helper_path(), "--do",
                                     "exit:0", "--for", "0=fail-attempts:9:4"});
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_EQ(lines_with(r.out, "[0] attempt ").size(), 3u) << r.out;
  EXPECT_NE(r.out.find("[0] attempt 2: fail"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace xs::testing
