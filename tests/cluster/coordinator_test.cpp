// The job coordinator's rules without a network: registration, the world, Stop on the first
// failure, the root cause among all reports, restarts, lost nodes and the rendezvous deadline.
#include <gtest/gtest.h>

#include "xla_spawn/cluster/coordinator.h"

namespace xs::cluster {
namespace {

using std::chrono::milliseconds;

Register node(uint32_t k, uint32_t nprocs = 2, uint32_t nnodes = 2) {
  return Register{k,
                  nnodes,
                  nprocs,
                  static_cast<int32_t>(100 + k),
                  "host" + std::to_string(k),
                  "198.18.0." + std::to_string(k + 1),
                  5000,
                  "./train --epochs 3"};
}

Failed failure(FailureKind kind, int local_ordinal, int64_t wall_ns, int exit_code,
               uint32_t attempt = 0) {
  Failed f;
  f.attempt = attempt;
  f.kind = kind;
  f.local_ordinal = local_ordinal;
  f.wall_ns = wall_ns;
  f.exit_code = exit_code;
  f.description = kind == FailureKind::kSignalled ? "killed by signal 9" : "exited with code 1";
  f.tail = {"last words"};
  return f;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorTest() : job_({.nnodes = 2, .max_restarts = 1, .rdzv_timeout = milliseconds(1000),
                            .torch_port = 5, .job_id = "xs-1-2"}, now_) {}
  std::vector<Outgoing> join_all() {
    std::get<std::vector<Outgoing>>(job_.on_register(node(0, 2)));
    return std::get<std::vector<Outgoing>>(job_.on_register(node(1, 3)));
  }
  Clock::time_point now_ = Clock::time_point() + std::chrono::hours(1);
  JobCoordinator job_;
};

// The one message of `out` if it is a T (a copy: `out` is often a temporary).
template <typename T>
std::optional<T> only(const std::vector<Outgoing>& out) {
  if (out.size() != 1 || !std::holds_alternative<T>(out.front().message)) return std::nullopt;
  return std::get<T>(out.front().message);
}

TEST_F(CoordinatorTest, TheWorldFormsWhenTheLastNodeRegisters) {
  EXPECT_TRUE(std::get<std::vector<Outgoing>>(job_.on_register(node(1, 3))).empty());
  const auto out = std::get<std::vector<Outgoing>>(job_.on_register(node(0, 2)));
  const std::optional<World> world = only<World>(out);
  ASSERT_TRUE(world);
  EXPECT_EQ(world->job_id, "xs-1-2");
  ASSERT_EQ(world->nodes.size(), 2u);
  EXPECT_EQ(world->nodes[0].nprocs, 2u);
  EXPECT_EQ(world->nodes[1].nprocs, 3u);
  EXPECT_EQ(world->nodes[1].host_addr, "198.18.0.2");
  EXPECT_EQ(world->notice, "");  // one command on every node
  EXPECT_EQ(job_.phase(), JobCoordinator::Phase::kRunning);
}

// A node of another job of the same user (same port, same token) used to join this one without
// a word, and the job's own node then waited out the rendezvous timeout.
TEST_F(CoordinatorTest, NodesRunningAnotherCommandAreNotedAsTheJobForms) {
  Register other = node(1, 3);
  other.command = "sh -c 'echo job B'";
  std::get<std::vector<Outgoing>>(job_.on_register(node(0, 2)));
  const std::optional<World> world =
      only<World>(std::get<std::vector<Outgoing>>(job_.on_register(other)));
  ASSERT_TRUE(world);
  EXPECT_EQ(world->notice,
            "node 1 (host host1) runs `sh -c 'echo job B'`, node 0 `./train --epochs 3`: if that "
            "node belongs to another job on this port, stop both");
}

// Every node prints what another says of itself: no terminal controls get through (a command
// line used to retitle the window, clear the screen and forge a line on every console).
TEST_F(CoordinatorTest, WhatANodeSaysOfItselfReachesTheConsolesWithoutTerminalControls) {
  Register other = node(1, 3);
  other.hostname = "h\x1b[2J";
  other.command = "./x $'\x1b]0;pwned\a'\nxla-spawn: job FAKE formed";
  std::get<std::vector<Outgoing>>(job_.on_register(node(0, 2)));
  const std::optional<World> world =
      only<World>(std::get<std::vector<Outgoing>>(job_.on_register(other)));
  ASSERT_TRUE(world);
  EXPECT_EQ(world->notice.find('\x1b'), std::string::npos) << world->notice;
  EXPECT_EQ(world->notice.find('\n'), std::string::npos) << world->notice;
  EXPECT_NE(world->notice.find("node 1 (host h\\x1b[2J) runs `./x $'\\x1b]0;pwned\\x07'\\x0axla"),
            std::string::npos)
      << world->notice;
  EXPECT_EQ(world->nodes[1].hostname, "h\\x1b[2J");
}

TEST_F(CoordinatorTest, AnAddressWithControlCharactersIsRefused) {
  Register other = node(1, 3);
  other.host_addr = "198.18.0.2\n";
  EXPECT_EQ(std::get<std::string>(job_.on_register(other)),
            "node 1 (host host1) gave the address '198.18.0.2\\x0a', which is no address");
}

TEST_F(CoordinatorTest, RefusesATakenRankAnOutOfRangeRankAndAnotherNnodes) {
  job_.on_register(node(0));
  auto taken = job_.on_register(Register{0, 2, 2, 999, "intruder", "198.18.0.9", 5000, "./x"});
  ASSERT_TRUE(std::holds_alternative<std::string>(taken));
  EXPECT_NE(std::get<std::string>(taken).find("already taken by host host0"), std::string::npos)
      << std::get<std::string>(taken);
  auto outside = job_.on_register(node(2, 1, 2));
  ASSERT_TRUE(std::holds_alternative<std::string>(outside));
  EXPECT_NE(std::get<std::string>(outside).find("outside 0..1"), std::string::npos);
  auto nnodes = job_.on_register(node(1, 1, 3));
  ASSERT_TRUE(std::holds_alternative<std::string>(nnodes));
  EXPECT_NE(std::get<std::string>(nnodes).find("--nnodes 3"), std::string::npos);
  EXPECT_TRUE(std::holds_alternative<std::string>(job_.on_register(node(1, 0))));
}

TEST_F(CoordinatorTest, TheRendezvousDeadlineNamesTheNodesThatNeverCame) {
  job_.on_register(node(0));
  EXPECT_TRUE(job_.on_tick(now_ + milliseconds(999)).empty());
  const std::optional<End> end = only<End>(job_.on_tick(now_ + milliseconds(1000)));
  ASSERT_TRUE(end);
  EXPECT_EQ(end->exit_code, kJobFailedExitCode);
  EXPECT_NE(end->summary.find("node(s) 1 never registered"), std::string::npos) << end->summary;
  EXPECT_NE(end->summary.find("node 0 (host host0"), std::string::npos) << end->summary;
}

TEST_F(CoordinatorTest, AtTheDeadlineANodeThatRegisteredAndLeftIsToldApartFromOneThatNeverCame) {
  job_.on_register(node(1));
  job_.on_lost(1, "connection closed", 0, now_);  // its launcher was Ctrl-C'ed
  const std::optional<End> end = only<End>(job_.on_tick(now_ + milliseconds(1000)));
  ASSERT_TRUE(end);
  EXPECT_NE(end->summary.find("node(s) 0 never registered; node 1 (host host1) registered and "
                              "then left (connection closed) (0 of 2 did)"),
            std::string::npos)
      << end->summary;
}

// What the master prints on SIGUSR1 and every 30 s while the job forms, and after.
TEST_F(CoordinatorTest, TheStatusNamesTheNodesAwaitedAndTheTimeLeft) {
  EXPECT_EQ(job_.status(now_), "0 of 2 nodes registered; waiting for node(s) 0-1; 1 s left");
  job_.on_register(node(1));
  job_.on_lost(1, "connection closed", 0, now_);
  EXPECT_EQ(job_.status(now_ + milliseconds(400)),
            "0 of 2 nodes registered; waiting for node(s) 0-1 (node 1 (host host1) registered "
            "and then left (connection closed)); 1 s left");
  job_.on_register(node(0));
  EXPECT_EQ(job_.status(now_ + milliseconds(600)),
            "1 of 2 nodes registered (0); waiting for node(s) 1 (node 1 (host host1) registered "
            "and then left (connection closed)); 0 s left");
  job_.on_register(node(1));
  EXPECT_EQ(job_.status(now_), "the job formed (2 nodes); attempt 0 runs");
}

TEST_F(CoordinatorTest, ANodeThatLeavesBeforeTheWorldFormsMayRegisterAgain) {
  job_.on_register(node(1));
  job_.on_lost(1, "connection closed", 0, now_);
  EXPECT_FALSE(job_.registered(1));
  EXPECT_TRUE(std::holds_alternative<std::vector<Outgoing>>(job_.on_register(node(1))));
}

// Hosts ran different arguments: node 1's replicas finished (exit 0) while node 0's were in a
// collective, which then failed on a reset connection. The cause says node 1 was done first.
TEST_F(CoordinatorTest, ANodeThatFinishedBeforeTheFailureIsNamedWithTheCause) {
  join_all();
  EXPECT_TRUE(job_.on_attempt_done(1, {0, 0}, now_).empty());
  EXPECT_TRUE(only<Stop>(job_.on_failed(0, failure(FailureKind::kExited, 0, 100, 2), now_)));
  const std::optional<Next> next = only<Next>(job_.on_attempt_done(0, {0, 2}, now_));
  ASSERT_TRUE(next);
  EXPECT_NE(next->cause.find("node 1 (host host1) had finished, every replica exiting 0, before "
                             "this failure"),
            std::string::npos)
      << next->cause;
  // A node that ends 0 only after the failure (its replicas stopped cleanly) is not named.
  job_.on_failed(0, failure(FailureKind::kExited, 0, 200, 2, 1), now_);
  job_.on_attempt_done(1, {1, 0}, now_);
  const std::optional<End> end = only<End>(job_.on_attempt_done(0, {1, 2}, now_));
  ASSERT_TRUE(end);
  EXPECT_EQ(end->summary.find("had finished"), std::string::npos) << end->summary;
}

TEST_F(CoordinatorTest, TheFirstFailureStopsEveryNodeAndTheSignalIsTheRootCause) {
  join_all();
  // Node 0's replica exits 1 (the echo of its peer's death) before node 1 reports the SIGKILL.
  const std::optional<Stop> stop = only<Stop>(job_.on_failed(0, failure(FailureKind::kExited, 1, 200, 1), now_));
  ASSERT_TRUE(stop);
  EXPECT_TRUE(job_.on_failed(1, failure(FailureKind::kSignalled, 2, 100, 137), now_).empty());
  EXPECT_TRUE(job_.on_attempt_done(0, {0, 1}, now_).empty());
  const auto out = job_.on_attempt_done(1, {0, 137}, now_);
  // max_restarts 1: the attempt restarts.
  const std::optional<Next> next = only<Next>(out);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->attempt, 1u);
  // Every node hears the root cause with the restart, node 0 too, which saw only its echo.
  EXPECT_NE(next->cause.find("attempt 0 failed"), std::string::npos) << next->cause;
  EXPECT_NE(next->cause.find("(node 1, host "), std::string::npos) << next->cause;
  EXPECT_NE(next->cause.find("local ordinal 2)"), std::string::npos) << next->cause;
  // Attempt 1 fails the same way with no restarts left: End names ordinal 4 = node 1's third.
  job_.on_failed(0, failure(FailureKind::kExited, 0, 300, 1, 1), now_);
  job_.on_failed(1, failure(FailureKind::kSignalled, 2, 250, 137, 1), now_);
  job_.on_attempt_done(0, {1, 1}, now_);
  const std::optional<End> end = only<End>(job_.on_attempt_done(1, {1, 137}, now_));
  ASSERT_TRUE(end);
  EXPECT_EQ(end->exit_code, 137);
  EXPECT_NE(end->summary.find("ordinal 4 (node 1, host host1, local ordinal 2) killed by signal 9"),
            std::string::npos)
      << end->summary;
  EXPECT_NE(end->summary.find("[4] last words"), std::string::npos) << end->summary;
  EXPECT_NE(end->summary.find("also: ordinal 0 (node 0"), std::string::npos) << end->summary;
}

TEST_F(CoordinatorTest, AmongExitsTheEarliestIsTheRootCause) {
  join_all();
  job_.on_failed(0, failure(FailureKind::kExited, 0, 500, 1), now_);
  job_.on_failed(1, failure(FailureKind::kExited, 1, 400, 3), now_);
  job_.on_attempt_done(0, {0, 1}, now_);
  job_.on_attempt_done(1, {0, 3}, now_);
  // Restarted once; the second time it ends.
  job_.on_failed(1, failure(FailureKind::kExited, 1, 400, 3, 1), now_);
  job_.on_attempt_done(0, {1, 1}, now_);
  const std::optional<End> end = only<End>(job_.on_attempt_done(1, {1, 3}, now_));
  ASSERT_TRUE(end);
  EXPECT_EQ(end->exit_code, 3);
}

TEST_F(CoordinatorTest, ALostNodeEndsTheJobWithoutARestart) {
  join_all();
  const std::optional<Stop> stop = only<Stop>(job_.on_lost(1, "no heartbeat for 5.0 s", 10, now_));
  ASSERT_TRUE(stop);
  EXPECT_NE(stop->reason.find("node 1 (host host1, 198.18.0.2) lost: no heartbeat"),
            std::string::npos)
      << stop->reason;
  job_.on_failed(0, failure(FailureKind::kExited, 0, 20, 1), now_);
  const std::optional<End> end = only<End>(job_.on_attempt_done(0, {0, 1}, now_));
  ASSERT_TRUE(end);
  EXPECT_EQ(end->exit_code, kJobFailedExitCode);
  EXPECT_NE(end->summary.find("node 1 (host host1, 198.18.0.2) lost"), std::string::npos)
      << end->summary;
}

// Node 0 finished; node 1's launcher was then SIGKILLed. Nothing suggests that the nodes ran
// different programs, so the summary says only that node 1 was lost.
TEST_F(CoordinatorTest, ALostNodeAfterAnotherFinishedGivesNoHintOfDifferentPrograms) {
  join_all();
  EXPECT_TRUE(job_.on_attempt_done(0, {0, 0}, now_).empty());
  const std::vector<Outgoing> out = job_.on_lost(1, "connection reset", 10, now_);
  ASSERT_FALSE(out.empty());
  ASSERT_TRUE(std::holds_alternative<End>(out.back().message)) << "the job waits for a lost node";
  const End& end = std::get<End>(out.back().message);
  EXPECT_EQ(end.exit_code, kJobFailedExitCode);
  EXPECT_NE(end.summary.find("node 1 (host host1, 198.18.0.2) lost"), std::string::npos)
      << end.summary;
  EXPECT_EQ(end.summary.find("had finished"), std::string::npos) << end.summary;
}

// An interruption before the other failures is their cause: it outranks them, even when
// their reports arrived first, and nothing restarts.
TEST_F(CoordinatorTest, AnInterruptionOutranksTheFailuresAfterItAndIsNotRestarted) {
  join_all();
  Failed sigint = failure(FailureKind::kInterrupted, -1, 50, 130);
  sigint.description = "was interrupted by SIGINT";
  job_.on_failed(1, failure(FailureKind::kSignalled, 0, 100, 137), now_);
  job_.on_failed(0, sigint, now_);
  job_.on_attempt_done(0, {0, 130}, now_);
  const std::optional<End> end = only<End>(job_.on_attempt_done(1, {0, 137}, now_));
  ASSERT_TRUE(end);
  EXPECT_EQ(end->exit_code, 130);
  EXPECT_NE(end->summary.find("node 0 (host host0, 198.18.0.1) was interrupted by SIGINT"),
            std::string::npos)
      << end->summary;
}

// Ctrl-C while a failing attempt stops: the failure stays the root cause, with its status,
// and the interruption only prevents the restart (max_restarts is 1 here).
TEST_F(CoordinatorTest, AnInterruptionAfterAFailureKeepsItTheRootCauseButPreventsTheRestart) {
  join_all();
  Failed sigint = failure(FailureKind::kInterrupted, -1, 900, 143);
  sigint.description = "was interrupted by SIGTERM";
  Failed exit3 = failure(FailureKind::kExited, 0, 100, 3);
  exit3.description = "exited with code 3";
  job_.on_failed(1, exit3, now_);
  job_.on_failed(0, sigint, now_);
  job_.on_attempt_done(0, {0, 143}, now_);
  const std::optional<End> end = only<End>(job_.on_attempt_done(1, {0, 3}, now_));
  ASSERT_TRUE(end) << "restarted after an interruption";
  EXPECT_EQ(end->exit_code, 3);
  EXPECT_NE(end->summary.find("exited with code 3"), std::string::npos) << end->summary;
}

TEST_F(CoordinatorTest, AFailureThatClaimsExitZeroStillFailsTheJob) {
  join_all();
  Failed odd = failure(FailureKind::kTimedOut, -1, 1, 0);
  job_.on_failed(1, odd, now_);
  job_.on_attempt_done(0, {0, 143}, now_);
  const std::optional<End> end = only<End>(job_.on_attempt_done(1, {0, 124}, now_));
  ASSERT_TRUE(end);
  EXPECT_EQ(end->exit_code, kJobFailedExitCode);
}

TEST_F(CoordinatorTest, SuccessEverywhereEndsWithZero) {
  join_all();
  EXPECT_TRUE(job_.on_attempt_done(1, {0, 0}, now_).empty());
  const std::optional<End> end = only<End>(job_.on_attempt_done(0, {0, 0}, now_));
  ASSERT_TRUE(end);
  EXPECT_EQ(end->exit_code, 0);
  EXPECT_TRUE(end->summary.empty());
}

TEST_F(CoordinatorTest, StaleReportsOfAnEarlierAttemptAreIgnored) {
  join_all();
  job_.on_failed(0, failure(FailureKind::kExited, 0, 1, 1), now_);
  job_.on_attempt_done(0, {0, 1}, now_);
  ASSERT_TRUE(only<Next>(job_.on_attempt_done(1, {0, 0}, now_)));
  EXPECT_TRUE(job_.on_failed(1, failure(FailureKind::kExited, 0, 2, 1, 0), now_).empty());
  EXPECT_TRUE(job_.on_attempt_done(1, {0, 1}, now_).empty());
  EXPECT_EQ(job_.phase(), JobCoordinator::Phase::kRunning);
}

}  // namespace
}  // namespace xs::cluster
