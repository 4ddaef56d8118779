// The fastest cases of scripts/fault-inject, one per kind that needs no mount namespace: a
// real xla-spawn job of train_fmnist at N = 2 takes a real signal (SIGKILL in the forward
// pass, inside the gradient all-reduce, during the checkpoint write; SIGSTOP past the
// collective timeout; SIGKILL and SIGINT of xla-spawn itself; a replica asleep on one node of
// a two-node job on this machine). Each case checks the exit, the
// ordinal and cause named, that no process of the job and no segment remain, and that the last
// completed checkpoint is intact; one case restarts and compares with a clean run byte for byte.

#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "xla_spawn/cluster/connection.h"
#include "tests/launcher/launch_support.h"
#include "tests/reliability/job_probe.h"
#include "tests/support/deadline_scale.h"
#include "tests/support/scoped_env.h"

namespace xs::testing {
namespace {

using std::chrono::seconds;

// Generous for a loaded 2-core machine: the job itself needs a second or two.
constexpr auto kJobDeadline = seconds(120);
constexpr auto kCleanupDeadline = seconds(10);

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool has_temporary(const std::string& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind(".model.ckpt.tmp.", 0) == 0) return true;
  }
  return false;
}

class FaultTest : public ::testing::Test {
 protected:
  std::vector<std::string> args(int steps, const std::vector<std::string>& launcher = {}) {
    std::vector<std::string> a = {"-n", "2", "--timeout", "100"};
    a.insert(a.end(), launcher.begin(), launcher.end());
    const std::vector<std::string> train = train_command(checkpoint(), steps);
    a.insert(a.end(), train.begin(), train.end());
    return a;
  }
  std::string checkpoint() const { return dir_ / "model.ckpt"; }

  // Nothing of the job is left: no tagged process, no segment of this launcher.
  void expect_nothing_left(pid_t launcher) {
    EXPECT_TRUE(wait_until([&] { return tagged_processes(tag_).empty(); }, kCleanupDeadline))
        << tagged_processes(tag_).size() << " process(es) of the job remain";
    EXPECT_TRUE(
        wait_until([&] { return segments_of_launcher(launcher).empty(); }, kCleanupDeadline))
        << "segment left: " << segments_of_launcher(launcher).front();
  }
  // Ordinal k's pid once it runs (0, failing the test, if it does not within seconds).
  pid_t replica_pid(int ordinal) {
    std::optional<pid_t> pid;
    EXPECT_TRUE(wait_until([&] { return (pid = tagged_replica(tag_, ordinal)).has_value(); },
                           kCleanupDeadline))
        << "ordinal " << ordinal << " never ran";
    return pid.value_or(0);
  }
  // Waits until training has saved its first checkpoint (so a fault lands mid-training).
  void wait_for_first_checkpoint(Launch& run) {
    ASSERT_TRUE(wait_until([&] { return std::filesystem::exists(checkpoint()); }, kJobDeadline))
        << run.err();
  }

  TempDir dir_;
  std::string tag_ = unique_tag();
  ScopedEnv tag_env_{kTrialTagEnv, tag_};
};

TEST_F(FaultTest, SigkillInTheForwardPassNamesTheOrdinalAndLeavesNothing) {
  ScopedEnv fault("XLA_SPAWN_TEST_FAULT", "forward@1:4");
  Launch run(args(9));
  const int status = run.wait_or_fail(kJobDeadline);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGKILL) << run.err();
  EXPECT_NE(run.err().find("ordinal 1 killed by signal 9"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find("SIGKILL in the forward pass of step 4"), std::string::npos)
      << run.err();
  expect_nothing_left(run.pid());
  EXPECT_EQ(check_checkpoint(checkpoint()).rfind("ok global_step=3 ", 0), 0u)
      << check_checkpoint(checkpoint());
}

TEST_F(FaultTest, SigkillInsideTheAllReduceNamesTheOrdinalAndLeavesNothing) {
  ScopedEnv fault("XLA_SPAWN_TEST_FAULT", "allreduce@0:5");
  Launch run(args(9));
  const int status = run.wait_or_fail(kJobDeadline);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGKILL) << run.err();
  EXPECT_NE(run.err().find("ordinal 0 killed by signal 9"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find("all_reduce of"), std::string::npos) << run.err();
  expect_nothing_left(run.pid());
  EXPECT_EQ(check_checkpoint(checkpoint()).rfind("ok global_step=3 ", 0), 0u)
      << check_checkpoint(checkpoint());
}

TEST_F(FaultTest, SigkillDuringTheCheckpointWriteKeepsThePreviousCheckpoint) {
  ScopedEnv fault("XLA_SPAWN_TEST_FAULT", "checkpoint@0:6");
  Launch run(args(9));
  const int status = run.wait_or_fail(kJobDeadline);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGKILL) << run.err();
  EXPECT_NE(run.err().find("ordinal 0 killed by signal 9"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find("SIGKILL during the checkpoint write"), std::string::npos) << run.err();
  EXPECT_TRUE(has_temporary(dir_.path())) << "the kill should have left the half-written temporary";
  expect_nothing_left(run.pid());
  EXPECT_EQ(check_checkpoint(checkpoint()).rfind("ok global_step=3 ", 0), 0u)
      << check_checkpoint(checkpoint());
}

TEST_F(FaultTest, StoppedReplicaTimesOutItsPeersAndIsNamed) {
  // Not smaller: a loaded machine must not time out the start on its own (under TSan at load
  // 20+ it did at 5 s, hence the sanitizer scale).
  ScopedEnv timeout("XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", std::to_string(5000 * deadline_scale()));
  Launch run(args(0, {"--grace-period", "1"}));
  wait_for_first_checkpoint(run);
  const pid_t victim = replica_pid(1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  const int status = run.wait_or_fail(kJobDeadline);
  EXPECT_NE(WEXITSTATUS(status), 0) << run.err();
  EXPECT_NE(run.err().find("ordinal 0 exited with code 1"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find("waiting for ordinal 1"), std::string::npos) << run.err();
  // The hang report printed when the collective timed out names the stopped ordinal.
  EXPECT_NE(run.err().find("hang report (a collective timed out):"), std::string::npos)
      << run.err();
  EXPECT_NE(run.err().find(fmt::format("ordinal 1 (pid {}, stopped): ", victim)),
            std::string::npos)
      << run.err();
  EXPECT_NE(run.err().find("held up by ordinal(s) 1 (stopped)"), std::string::npos) << run.err();
  // ...and its stack, from where it was stopped, with function names (continued for it).
  EXPECT_NE(run.err().find(fmt::format("[1] xla-spawn: stack of pid {}, ", victim)),
            std::string::npos)
      << run.err();
  EXPECT_NE(run.err().find("[1]   at main (train_fmnist+"), std::string::npos) << run.err();
  expect_nothing_left(run.pid());
  EXPECT_EQ(check_checkpoint(checkpoint()).rfind("ok ", 0), 0u) << check_checkpoint(checkpoint());
}

// Ctrl-Z (SIGTSTP) to xla-spawn stops its replicas with it; continued after longer than the
// collective timeout, the job goes on: no replica blocked on the stopped launcher's pipe
// while its peers timed out blaming it (issue 20, finding 7).
TEST_F(FaultTest, CtrlZStopsTheWholeJobWhichGoesOnWhenContinued) {
  const int timeout_ms = 3000 * deadline_scale();
  ScopedEnv timeout("XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", std::to_string(timeout_ms));
  Launch run(args(0));
  wait_for_first_checkpoint(run);
  const std::vector<pid_t> replicas = {replica_pid(0), replica_pid(1)};
  ASSERT_GT(replicas[0], 0);
  ASSERT_GT(replicas[1], 0);
  ASSERT_EQ(::kill(run.pid(), SIGTSTP), 0);
  const auto all_stopped = [&] {
    if (process_state(run.pid()) != 'T') return false;
    for (pid_t pid : replicas) {
      if (process_state(pid) != 'T') return false;
    }
    return true;
  };
  ASSERT_TRUE(wait_until(all_stopped, kCleanupDeadline))
      << "launcher " << process_state(run.pid()) << ", replicas " << process_state(replicas[0])
      << process_state(replicas[1]) << "\n"
      << run.err();
  std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms + 2000));
  ASSERT_TRUE(all_stopped()) << run.err();
  const auto saved = std::filesystem::last_write_time(checkpoint());
  ASSERT_EQ(::kill(run.pid(), SIGCONT), 0);
  // Checkpoints come every 3 steps: a new one means collectives completed after the stop.
  EXPECT_TRUE(wait_until(
      [&] {
        std::error_code ec;
        const auto now = std::filesystem::last_write_time(checkpoint(), ec);
        return !ec && now != saved;
      },
      kJobDeadline))
      << run.err();
  EXPECT_FALSE(run.wait_for(std::chrono::milliseconds(0)).has_value()) << run.err();
  ASSERT_EQ(::kill(run.pid(), SIGINT), 0);
  const int status = run.wait_or_fail(kJobDeadline);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT) << run.err();
  EXPECT_NE(run.err().find("received SIGTSTP; stopping 2 replica(s) with xla-spawn"),
            std::string::npos)
      << run.err();
  EXPECT_EQ(run.err().find("timed out"), std::string::npos) << run.err();
  expect_nothing_left(run.pid());
}

// kill -USR1 <xla-spawn> prints what every ordinal is doing without stopping the job: the
// stopped ordinal and its collective, the other waiting for it, with the program's graph.
TEST_F(FaultTest, SigusrOneReportsWhereEachOrdinalIsAndTheJobGoesOn) {
  Launch run(args(0, {"--grace-period", "1"}));
  wait_for_first_checkpoint(run);
  const pid_t victim = replica_pid(1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  // Asked again each second until ordinal 0 has gone to sleep on it.
  const auto held_up = [&] {
    return run.err().find("held up by ordinal(s) 1 (stopped)") != std::string::npos;
  };
  EXPECT_TRUE(wait_until(
      [&] {
        ::kill(run.pid(), SIGUSR1);
        return wait_until(held_up, std::chrono::seconds(1));
      },
      kCleanupDeadline))
      << run.err();
  const std::string err = run.err();
  EXPECT_NE(err.find("hang report (SIGUSR1):"), std::string::npos) << err;
  EXPECT_NE(err.find(fmt::format("ordinal 1 (pid {}, stopped): ", victim)), std::string::npos)
      << err;
  EXPECT_NE(err.find("waiting"), std::string::npos) << err;
  EXPECT_NE(err.find("for ordinal 1; "), std::string::npos) << err;
  EXPECT_NE(err.find(" waited, last to arrive at "), std::string::npos) << err;  // arrivals
  EXPECT_NE(err.find(", graph "), std::string::npos) << err;
  // No stacks on SIGUSR1: a healthy job's replicas are not signalled (see report_calls).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(run.err().find("xla-spawn: stack of pid"), std::string::npos) << run.err();
  EXPECT_EQ(process_state(victim), 'T');
  EXPECT_FALSE(run.wait_for(std::chrono::milliseconds(0)).has_value()) << "the job went on";
  ASSERT_EQ(::kill(victim, SIGCONT), 0);
  ASSERT_EQ(::kill(run.pid(), SIGINT), 0);
  run.wait_or_fail(kJobDeadline);
  expect_nothing_left(run.pid());
}

// A replica stuck outside any collective (asleep in its forward pass): the report printed at
// the timeout names it as holding the job up and shows where it sleeps.
TEST_F(FaultTest, AReplicaStuckInASleepIsNamedWithItsStackWhenItsPeerTimesOut) {
  ScopedEnv fault("XLA_SPAWN_TEST_FAULT", "sleep@1:4");
  ScopedEnv timeout("XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", std::to_string(5000 * deadline_scale()));
  Launch run(args(0, {"--grace-period", "1"}));
  const int status = run.wait_or_fail(kJobDeadline);
  EXPECT_NE(WEXITSTATUS(status), 0) << run.err();
  const std::string err = run.err();
  EXPECT_NE(err.find("fault hook: ordinal 1 sleeps in the forward pass of step 4"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("hang report (a collective timed out):"), std::string::npos) << err;
  EXPECT_NE(err.find("held up by ordinal(s) 1 (sleeping)"), std::string::npos) << err;
  EXPECT_NE(err.find("[1] xla-spawn: stack of pid"), std::string::npos) << err;
  EXPECT_NE(err.find("[1]   at xs::fmnist::FaultHook::at_forward(long) (train_fmnist+"),
            std::string::npos)
      << err;
  expect_nothing_left(run.pid());
}

// Two nodes on this machine; the last ordinal (on node 1) sleeps in its forward pass. Node 0's
// replicas, done with the step's local phase, wait for node 1 between nodes and time out
// first (node 1's replicas wait six times longer): node 1 then stops for node 0's failure, and
// only its own report and stacks can show the sleeper. The launchers' outputs, node by node.
std::vector<std::string> run_with_a_sleeper_on_node_one(int replicas_per_node) {
  const uint16_t port = cluster::pick_free_port("127.0.0.1");
  ScopedEnv token("XLA_SPAWN_JOB_TOKEN", "fault-test-token-0123456789abcdef");
  ScopedEnv fault("XLA_SPAWN_TEST_FAULT", fmt::format("sleep@{}:4", 2 * replicas_per_node - 1));
  std::vector<std::unique_ptr<Launch>> nodes;
  for (const int node : {0, 1}) {
    const int timeout_ms = (node == 0 ? 5000 : 30000) * deadline_scale();
    ScopedEnv timeout("XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", std::to_string(timeout_ms));
    std::vector<std::string> a = {"--nnodes", "2", "--node-rank", std::to_string(node),
                                  "--master-addr", "127.0.0.1", "--master-port",
                                  std::to_string(port), "-n", std::to_string(replicas_per_node),
                                  "--grace-period", "1", "--timeout", "100", "--",
                                  train_fmnist_path()};
    for (const char* word : {"--model", "mlp", "--batch-size", "16", "--epochs", "1000",
                             "--train-samples", "4096", "--no-eval", "--seed", "7"}) {
      a.push_back(word);
    }
    nodes.push_back(std::make_unique<Launch>(a));
  }
  std::vector<std::string> errs;
  for (const auto& node : nodes) {
    EXPECT_NE(WEXITSTATUS(node->wait_or_fail(kJobDeadline)), 0);
    errs.push_back(node->err());
  }
  return errs;
}

constexpr const char* kPeerStopReport =
    "hang report (the job stops for another node; a replica here has been inside a collective "
    "call for ";

TEST_F(FaultTest, AReplicaStuckOnAnotherNodeIsNamedWithItsStackByItsOwnNode) {
  const std::vector<std::string> errs = run_with_a_sleeper_on_node_one(2);
  const std::string &zero = errs[0], &one = errs[1];
  EXPECT_NE(zero.find("between nodes for "), std::string::npos) << zero;
  EXPECT_NE(one.find("fault hook: ordinal 3 sleeps in the forward pass of step 4"),
            std::string::npos)
      << one;
  EXPECT_NE(one.find(kPeerStopReport), std::string::npos) << one;
  EXPECT_NE(one.find("held up by ordinal(s) 3 (sleeping)"), std::string::npos) << one;
  EXPECT_NE(one.find("[3] xla-spawn: stack of pid"), std::string::npos) << one;
  EXPECT_NE(one.find("[3]   at xs::fmnist::FaultHook::at_forward(long) (train_fmnist+"),
            std::string::npos)
      << one;
}

// The same with one replica per node: node 0's only replica keeps its records in the node's
// segment all the same, so its report, printed when it timed out, shows it waiting between
// nodes. (Node 1's sleeper is between calls, which says nothing of a hang there: no report.)
TEST_F(FaultTest, NodesOfOneReplicaReportTheirReplicaToo) {
  const std::vector<std::string> errs = run_with_a_sleeper_on_node_one(1);
  const std::string& zero = errs[0];
  EXPECT_NE(zero.find("hang report (a collective timed out):"), std::string::npos) << zero;
  EXPECT_NE(zero.find("  ordinal 0 (pid "), std::string::npos) << zero;
  EXPECT_NE(zero.find(" between nodes for "), std::string::npos) << zero;
  EXPECT_EQ(zero.find("no collective call yet"), std::string::npos) << zero;
}

// A straggler: ordinal 2 of 3 sleeps 20 ms in every step's forward pass, so it comes last to
// nearly every step's gradient all-reduce; at the end the launcher names it.
TEST_F(FaultTest, AReplicaSlowedOnPurposeIsNamedAsTheStragglerAtTheEnd) {
  ScopedEnv fault("XLA_SPAWN_TEST_FAULT", "slow@2:20");
  std::vector<std::string> a = {"-n", "3", "--timeout", "100"};
  const std::vector<std::string> train = train_command(checkpoint(), 40);
  a.insert(a.end(), train.begin(), train.end());
  Launch run(a);
  const int status = run.wait_or_fail(kJobDeadline);
  EXPECT_EQ(WEXITSTATUS(status), 0) << run.err();
  const std::string err = run.err();
  // Judged on the steps' gradient all-reduces, not the checkpoint's calls (every 3 steps),
  // where ordinal 0, the writer, is the late one.
  const size_t line = err.find("xla-spawn: ordinal 2 arrived last at ");
  ASSERT_NE(line, std::string::npos) << err;
  EXPECT_NE(err.find("training steps that waited", line), std::string::npos) << err;
  EXPECT_NE(err.find("ms after the first on average", line), std::string::npos) << err;
  EXPECT_EQ(err.find("ordinal 0 arrived last"), std::string::npos) << err;
  EXPECT_EQ(err.find("ordinal 1 arrived last"), std::string::npos) << err;
  expect_nothing_left(run.pid());
}

// The same straggler, then stopped past the collective timeout: the hang report printed at the
// timeout ends with the straggler line, and the launcher does not print it a second time when
// the replicas have ended.
TEST_F(FaultTest, AStragglerNamedByTheHangReportIsNotNamedAgainAtTheEnd) {
  ScopedEnv fault("XLA_SPAWN_TEST_FAULT", "slow@2:20");
  ScopedEnv timeout("XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", std::to_string(5000 * deadline_scale()));
  std::vector<std::string> a = {"-n", "3", "--timeout", "100", "--grace-period", "1"};
  const std::vector<std::string> train = train_command(checkpoint(), 0);
  a.insert(a.end(), train.begin(), train.end());
  Launch run(a);
  // 36 steps, so that more than kStragglerMinCalls (20) of them waited for ordinal 2. The
  // checkpoint (every 3 steps) is read only when it changed: each read is a process.
  std::filesystem::file_time_type seen{};
  long long step = -1;
  const auto trained = [&] {
    std::error_code ec;
    const auto written = std::filesystem::last_write_time(checkpoint(), ec);
    if (ec || written == seen) return false;
    seen = written;
    std::sscanf(check_checkpoint(checkpoint()).c_str(), "ok global_step=%lld", &step);
    return step >= 36;
  };
  ASSERT_TRUE(wait_until(trained, kJobDeadline)) << "step " << step << "\n" << run.err();
  const pid_t victim = replica_pid(2);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  const int status = run.wait_or_fail(kJobDeadline);
  EXPECT_NE(WEXITSTATUS(status), 0) << run.err();
  const std::string err = run.err();
  const size_t report = err.find("hang report (a collective timed out):");
  ASSERT_NE(report, std::string::npos) << err;
  ASSERT_NE(err.find("\n  ordinal 2 arrived last at ", report), std::string::npos) << err;
  int named = 0;
  for (size_t at = err.find("arrived last at "); at != std::string::npos;
       at = err.find("arrived last at ", at + 1)) {
    ++named;
  }
  EXPECT_EQ(named, 1) << err;
  expect_nothing_left(run.pid());
}

// A replica that exits 0 before it joins the job (before init) cannot come to a collective:
// its peer, waiting for it, stops within seconds instead of at the collective timeout.
TEST_F(FaultTest, AReplicaThatEndsWithoutJoiningFailsItsWaitingPeerWithinSeconds) {
  ScopedEnv timeout("XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", "60000");
  std::vector<std::string> train = train_command(checkpoint(), 5);
  train.erase(train.begin());  // its "--"
  std::string command = "if [ \"$RANK\" = 1 ]; then exit 0; fi; exec";
  for (const std::string& word : train) command += " '" + word + "'";
  const auto start = Clock::now();
  Launch run({"-n", "2", "--", "/bin/sh", "-c", command});
  const int status = run.wait_or_fail(kJobDeadline);
  EXPECT_LT(std::chrono::duration<double>(run.exit_time() - start).count(), 30.0) << run.err();
  EXPECT_EQ(WEXITSTATUS(status), 1) << run.err();
  EXPECT_NE(run.err().find("failed after"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find("ordinal 1 exited with code 0 without joining the job, and ordinal 0 "
                           "has waited"),
            std::string::npos)
      << run.err();
  expect_nothing_left(run.pid());
}

TEST_F(FaultTest, SigkillOfXlaSpawnLeavesNoReplicaAndNoSegment) {
  Launch run(args(0));
  wait_for_first_checkpoint(run);
  ASSERT_FALSE(segments_of_launcher(run.pid()).empty()) << "the job should hold a segment";
  ASSERT_EQ(::kill(run.pid(), SIGKILL), 0);
  run.wait_or_fail(kCleanupDeadline);
  expect_nothing_left(run.pid());
  EXPECT_TRUE(wait_until([&] { return run.err().find("xla-spawn reaper:") != std::string::npos; },
                         kCleanupDeadline))
      << run.err();
  EXPECT_EQ(check_checkpoint(checkpoint()).rfind("ok ", 0), 0u) << check_checkpoint(checkpoint());
}

TEST_F(FaultTest, SigintToXlaSpawnStopsTheJobCleanly) {
  Launch run(args(0));
  wait_for_first_checkpoint(run);
  ASSERT_EQ(::kill(run.pid(), SIGINT), 0);
  const int status = run.wait_or_fail(kJobDeadline);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT) << run.err();
  EXPECT_NE(run.err().find("interrupted by SIGINT"), std::string::npos) << run.err();
  expect_nothing_left(run.pid());
  EXPECT_EQ(check_checkpoint(checkpoint()).rfind("ok ", 0), 0u) << check_checkpoint(checkpoint());
}

TEST_F(FaultTest, RestartAfterASigkillFinishesWithTheParametersOfACleanRun) {
  TempDir clean_dir;
  {
    std::vector<std::string> a = {"-n", "2"};
    const std::vector<std::string> train = train_command(clean_dir / "model.ckpt", 9);
    a.insert(a.end(), train.begin(), train.end());
    const RunResult clean = run_xla_spawn(a, kJobDeadline);
    ASSERT_EQ(clean.exit_code, 0) << clean.err;
  }
  ScopedEnv fault("XLA_SPAWN_TEST_FAULT", "allreduce@1:7");
  Launch run(args(9, {"--max-restarts", "1"}));
  const int status = run.wait_or_fail(kJobDeadline);
  ASSERT_EQ(WEXITSTATUS(status), 0) << run.err();
  EXPECT_NE(run.err().find("ordinal 1 killed by signal 9"), std::string::npos) << run.err();
  EXPECT_NE(run.out().find("resumed from"), std::string::npos) << run.out();
  const std::string resumed = file_bytes(checkpoint());
  ASSERT_FALSE(resumed.empty());
  EXPECT_TRUE(resumed == file_bytes(clean_dir / "model.ckpt"))
      << "the resumed run's final checkpoint differs from the clean run's";
  expect_nothing_left(run.pid());
}

}  // namespace
}  // namespace xs::testing
