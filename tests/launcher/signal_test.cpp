// Signals: SIGINT/SIGTERM/SIGHUP to xla-spawn reach every replica; a second SIGINT kills at
// once; and SIGKILL of xla-spawn itself leaves no replica behind (parent-death signal).

#include <sys/wait.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/launcher/launch_support.h"
#include "tests/support/deadline_scale.h"

namespace xs::testing {
namespace {

class ForwardTest : public ::testing::TestWithParam<int> {};

TEST_P(ForwardTest, SignalToXlaSpawnIsForwardedToEveryReplica) {
  const int signo = GetParam();
  const std::string name = std::string("SIG") + sigabbrev_np(signo);
  TempDir dir;
  // The default 3 s grace period, stretched under sanitizers: a replica starved of CPU under
  // TSan once ran its handler too late and was SIGKILLed, which this test would misread.
  const std::string grace_s = std::to_string(3 * deadline_scale());
  Launch run({"-n", "3", "--grace-period", grace_s, "--", helper_path(), "--pid-dir", dir.path(),
              "--do", "catch:30"});
  ASSERT_EQ(wait_for_pids(dir.path(), 3, std::chrono::seconds(20)).size(), 3u);
  ASSERT_EQ(::kill(run.pid(), signo), 0);
  const int status = run.wait_or_fail(scaled(std::chrono::seconds(20)));
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 128 + signo) << run.err();
  for (int k = 0; k < 3; ++k) {
    const std::string line =
        "[" + std::to_string(k) + "] ordinal " + std::to_string(k) + " caught " + name + "\n";
    EXPECT_NE(run.out().find(line), std::string::npos) << run.out();
  }
  EXPECT_NE(run.err().find("interrupted by " + name), std::string::npos) << run.err();
}

INSTANTIATE_TEST_SUITE_P(Signals, ForwardTest, ::testing::Values(SIGINT, SIGTERM, SIGHUP, SIGQUIT),
                         [](const auto& info) { return std::string(sigabbrev_np(info.param)); });

class SecondSignalTest : public ::testing::TestWithParam<int> {};

TEST_P(SecondSignalTest, KillsReplicasThatIgnoreTheFirst) {
  const int signo = GetParam();
  const std::string name = std::string("SIG") + sigabbrev_np(signo);
  TempDir dir;
  // A 60 s grace period: only the second signal can explain a quick end.
  Launch run({"-n", "2", "--grace-period", "60", "--", helper_path(), "--pid-dir", dir.path(),
              "--do", "ignore-all:30"});
  const std::vector<pid_t> pids = wait_for_pids(dir.path(), 2, std::chrono::seconds(20));
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(run.pid(), signo), 0);
  const std::string received = "received " + name + ";";
  ASSERT_TRUE(wait_until([&] { return run.err().find(received) != std::string::npos; },
                         scaled(std::chrono::seconds(10))))
      << run.err();
  for (pid_t pid : pids) EXPECT_TRUE(process_alive(pid)) << "ignored " << name << ", must run";
  // A second one after the first's half second (within it, it counts as the same one).
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  const auto second_at = Clock::now();
  ASSERT_EQ(::kill(run.pid(), signo), 0);
  const int status = run.wait_or_fail(std::chrono::seconds(20));
  EXPECT_LT(std::chrono::duration<double>(run.exit_time() - second_at).count(), 5.0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + signo) << run.err();
  EXPECT_NE(run.err().find("received " + name + " again; killing"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find("SIGKILL needed for 0-1"), std::string::npos) << run.err();
}

INSTANTIATE_TEST_SUITE_P(Signals, SecondSignalTest,
                         ::testing::Values(SIGINT, SIGTERM, SIGHUP, SIGQUIT),
                         [](const auto& info) { return std::string(sigabbrev_np(info.param)); });

// Started under nohup, xla-spawn keeps SIGHUP ignored: the job outlives its terminal.
TEST(ForwardTest, UnderNohupAHangupLeavesTheJobRunning) {
  const std::string nohup = "/usr/bin/nohup";
  if (::access(nohup.c_str(), X_OK) != 0) GTEST_SKIP() << "needs " << nohup << " (coreutils)";
  TempDir dir;
  Launch run({nohup, xla_spawn_path(), "-n", "2", "--", helper_path(), "--pid-dir", dir.path(),
              "--do", "sleep:1"},
             /*raw=*/true);
  ASSERT_EQ(wait_for_pids(dir.path(), 2, std::chrono::seconds(20)).size(), 2u);
  ASSERT_EQ(::kill(run.pid(), SIGHUP), 0);
  const int status = run.wait_or_fail(scaled(std::chrono::seconds(20)));
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << run.err();
  EXPECT_EQ(run.err().find("SIGHUP"), std::string::npos) << run.err();
}

// A replica stopped (SIGSTOP) when the job is interrupted is continued to take the signal, and
// ends at once instead of waiting out the grace period for SIGKILL.
TEST(ForwardTest, AStoppedReplicaIsContinuedToTakeTheSignal) {
  TempDir dir;
  Launch run({"-n", "2", "--grace-period", "60", "--", helper_path(), "--pid-dir", dir.path(),
              "--do", "sleep:30"});
  const std::vector<pid_t> pids = wait_for_pids(dir.path(), 2, std::chrono::seconds(20));
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(pids[1], SIGSTOP), 0);
  ASSERT_TRUE(wait_until([&] { return process_state(pids[1]) == 'T'; },
                         scaled(std::chrono::seconds(10))));
  const auto interrupted_at = Clock::now();
  ASSERT_EQ(::kill(run.pid(), SIGTERM), 0);
  const int status = run.wait_or_fail(scaled(std::chrono::seconds(30)));
  EXPECT_LT(std::chrono::duration<double>(run.exit_time() - interrupted_at).count(), 20.0)
      << "waited for the 60 s grace period";
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << run.err();
  EXPECT_EQ(run.err().find("SIGKILL needed"), std::string::npos) << run.err();
}

// An interrupt while the job already stops for a failure ends it: the failure stays the
// summary and the status, the grace period runs on, and --max-restarts restarts nothing.
TEST(ForwardTest, AnInterruptWhileAFailureStopsTheJobPreventsTheRestart) {
  TempDir dir;
  Launch run({"-n", "2", "--grace-period", "3", "--max-restarts", "2", "--", helper_path(),
              "--pid-dir", dir.path(), "--wait-peers", "--do", "ignore-term:15", "--for",
              "0=exit:3"});
  ASSERT_TRUE(wait_until(
      [&] { return run.err().find("stopping the other 1 replica(s)") != std::string::npos; },
      scaled(std::chrono::seconds(20))))
      << run.err();
  ASSERT_EQ(::kill(run.pid(), SIGINT), 0);
  const int status = run.wait_or_fail(scaled(std::chrono::seconds(30)));
  EXPECT_EQ(WEXITSTATUS(status), 3) << run.err();
  EXPECT_NE(run.err().find("received SIGINT while already stopping 1 replica(s); no restart"),
            std::string::npos)
      << run.err();
  EXPECT_EQ(run.err().find("restarting"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find("ordinal 0 exited with code 3"), std::string::npos) << run.err();
}

// The same signal again within half a second is one interrupt delivered twice (a wrapper
// passing it on while the terminal or a group kill reached xla-spawn too), not a second one.
TEST(ForwardTest, TheSameSignalAgainWithinHalfASecondIsTheSameInterrupt) {
  TempDir dir;
  Launch run({"-n", "2", "--grace-period", "60", "--", helper_path(), "--pid-dir", dir.path(),
              "--do", "ignore-all:30"});
  const std::vector<pid_t> pids = wait_for_pids(dir.path(), 2, std::chrono::seconds(20));
  ASSERT_EQ(pids.size(), 2u);
  const auto first_at = Clock::now();
  ASSERT_EQ(::kill(run.pid(), SIGINT), 0);
  ASSERT_TRUE(wait_until([&] { return run.err().find("received SIGINT;") != std::string::npos; },
                         scaled(std::chrono::seconds(10))))
      << run.err();
  ASSERT_EQ(::kill(run.pid(), SIGINT), 0);  // handled, so not merged with the first
  const double gap = std::chrono::duration<double>(Clock::now() - first_at).count();
  if (gap > 0.25) GTEST_SKIP() << "this test was descheduled for " << gap << " s";
  ASSERT_TRUE(wait_until(
      [&] {
        return run.err().find("received SIGINT again within 500 ms") != std::string::npos ||
               run.err().find("killing") != std::string::npos;
      },
      scaled(std::chrono::seconds(10))))
      << run.err();
  EXPECT_EQ(run.err().find("killing"), std::string::npos) << run.err();
  for (pid_t pid : pids) EXPECT_TRUE(process_alive(pid)) << "ignored SIGINT, must still run";
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // past the window
  ASSERT_EQ(::kill(run.pid(), SIGINT), 0);
  const int status = run.wait_or_fail(std::chrono::seconds(20));
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130) << run.err();
  EXPECT_NE(run.err().find("received SIGINT again; killing"), std::string::npos) << run.err();
}

// A second interrupt of another kind is named as following the first, not as the same again.
TEST(SecondSignalTest, AnotherSignalAfterTheFirstIsNamedAsSuch) {
  TempDir dir;
  Launch run({"-n", "2", "--grace-period", "60", "--", helper_path(), "--pid-dir", dir.path(),
              "--do", "ignore-all:30"});
  ASSERT_EQ(wait_for_pids(dir.path(), 2, std::chrono::seconds(20)).size(), 2u);
  ASSERT_EQ(::kill(run.pid(), SIGTERM), 0);
  ASSERT_TRUE(wait_until([&] { return run.err().find("received SIGTERM;") != std::string::npos; },
                         scaled(std::chrono::seconds(10))))
      << run.err();
  ASSERT_EQ(::kill(run.pid(), SIGINT), 0);
  const int status = run.wait_or_fail(std::chrono::seconds(20));
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << run.err();
  EXPECT_NE(run.err().find("received SIGINT after SIGTERM; killing 2 replica(s) now"),
            std::string::npos)
      << run.err();
}

class OrphanTest : public ::testing::TestWithParam<const char*> {};

TEST_P(OrphanTest, SigkillOfXlaSpawnLeavesNoReplicaAliveAfterOneSecond) {
  constexpr int kWorld = 4;
  TempDir dir;
  Launch run({"-n", std::to_string(kWorld), "--", helper_path(), "--pid-dir", dir.path(), "--do",
              GetParam()});
  const std::vector<pid_t> pids = wait_for_pids(dir.path(), kWorld, std::chrono::seconds(20));
  ASSERT_EQ(pids.size(), static_cast<size_t>(kWorld));
  for (pid_t pid : pids) ASSERT_TRUE(process_alive(pid)) << pid;
  ASSERT_EQ(::kill(run.pid(), SIGKILL), 0);
  const std::optional<int> status = run.wait_for(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(WIFSIGNALED(*status));
  const bool all_gone = wait_until(
      [&] {
        for (pid_t pid : pids) {
          if (process_alive(pid)) return false;
        }
        return true;
      },
      std::chrono::seconds(1));
  EXPECT_TRUE(all_gone) << "replicas still alive 1 s after xla-spawn was SIGKILLed";
}

// A replica (ordinal $RANK) that starts `sleep 300` in a session of its own, writes its pid to
// DIR/pid.$RANK and then sleeps too.
std::string start_an_escaper(const std::string& dir) {
  return "/usr/bin/setsid sleep 300 & echo $! > " + dir + "/pid.$RANK.tmp; mv " + dir +
         "/pid.$RANK.tmp " + dir + "/pid.$RANK; exec sleep 300";
}

// SIGKILLs the launcher of `run` once its `n` escapers have started (DIR/pid.K), and expects
// them gone within `within` (each killed at the end either way).
void kill_the_launcher_and_expect_the_escapers_gone(Launch& run, const std::string& dir, int n,
                                                    std::chrono::seconds within) {
  const std::vector<pid_t> escaped = wait_for_pids(dir, n, std::chrono::seconds(20));
  ASSERT_EQ(escaped.size(), static_cast<size_t>(n)) << run.err();
  // Its pid is written as soon as it is forked, before setsid has taken it out of the group.
  for (pid_t pid : escaped) {
    ASSERT_TRUE(wait_until([&] { return ::getpgid(pid) == pid; }, std::chrono::seconds(10)))
        << "pid " << pid << " never left its replica's group";
  }
  ASSERT_EQ(::kill(run.pid(), SIGKILL), 0);
  ASSERT_TRUE(run.wait_for(std::chrono::seconds(10)).has_value());
  for (pid_t pid : escaped) {
    EXPECT_TRUE(wait_until([&] { return !process_alive(pid); }, scaled(within)))
        << "a setsid child (pid " << pid << ") outlived the SIGKILLed xla-spawn";
    if (process_alive(pid)) ::kill(pid, SIGKILL);
  }
}

// What a replica started in a session of its own escapes the group kill and, with xla-spawn
// gone, the subreaper: xla-spawn's reaper finds it by the job it inherited and kills it too.
TEST(OrphanTest, WhatAReplicaStartedInASessionOfItsOwnDiesWithAKilledXlaSpawn) {
  TempDir dir;
  Launch run({"-n", "2", "--", "/bin/sh", "-c", start_an_escaper(dir.path())});
  kill_the_launcher_and_expect_the_escapers_gone(run, dir.path(), 2, std::chrono::seconds(3));
  EXPECT_TRUE(wait_until(
      [&] { return run.err().find("and 2 process(es) the replicas started outside them") != std::string::npos; },
      scaled(std::chrono::seconds(3))))
      << run.err();
}

// A job run by a replica (a nested xla-spawn) carries the outer job's mark in its launcher and
// reaper: a SIGKILL of the outer launcher kills the inner launcher, and the inner reaper, left
// alive, cleans up the inner job, what its replicas started in sessions of their own too.
TEST(OrphanTest, ANestedJobIsCleanedUpByItsOwnReaperWhenTheOuterLauncherIsKilled) {
  TempDir dir;
  Launch run({"-n", "1", "--", xla_spawn_path(), "-n", "2", "--", "/bin/sh", "-c",
              start_an_escaper(dir.path())});
  // The inner launcher: the parent of an inner replica, the parent of an escaper.
  const auto parent = [](pid_t pid) {
    const std::string stat = read_file(fmt::format("/proc/{}/stat", pid));
    const size_t paren = stat.rfind(')');
    return paren == std::string::npos ? 0 : std::atoi(stat.c_str() + paren + 4);
  };
  const std::vector<pid_t> escaped = wait_for_pids(dir.path(), 2, std::chrono::seconds(20));
  ASSERT_EQ(escaped.size(), 2u) << run.err();
  const std::string inner_launcher = std::to_string(parent(parent(escaped[0])));
  kill_the_launcher_and_expect_the_escapers_gone(run, dir.path(), 2, std::chrono::seconds(5));
  // The inner job's segment (its id holds the inner launcher's pid) is removed by the inner
  // reaper.
  const std::string prefix = "xla-spawn-" + std::to_string(::getuid()) + "-xs-" + inner_launcher + "-";
  const auto inner_segments = [&] {
    int n = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
      n += entry.path().filename().string().starts_with(prefix) ? 1 : 0;
    }
    return n;
  };
  EXPECT_TRUE(wait_until([&] { return inner_segments() == 0; }, scaled(std::chrono::seconds(5))))
      << "the inner job's segment " << prefix << "* is left";
}

INSTANTIATE_TEST_SUITE_P(Replicas, OrphanTest, ::testing::Values("sleep:30", "ignore-all:30"),
                         [](const auto& info) {
                           return std::strcmp(info.param, "sleep:30") == 0 ? "Sleeping"
                                                                           : "IgnoringSignals";
                         });

}  // namespace
}  // namespace xs::testing
