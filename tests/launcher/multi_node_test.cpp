// Multi-node jobs on one machine: one real xla-spawn per node, all on 127.0.0.1 (the
// namespace-cluster tests in tests/cluster/ run the same jobs between hosts with links that
// can be cut). The job forms, its replicas know where they sit, a failure on any node stops
// every node with the root cause's status and name, a vanished or frozen node is found within
// the heartbeat timeout, and restarts run on every node.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <memory>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "xla_spawn/cluster/connection.h"
#include "tests/launcher/launch_support.h"
#include "tests/support/deadline_scale.h"
#include "tests/support/scoped_env.h"

namespace xs::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class MultiNodeTest : public ::testing::Test {
 protected:
  // A launcher of node `node` of `nnodes` with `nprocs` replicas of the helper.
  std::unique_ptr<Launch> start_node(int node, int nnodes, int nprocs,
                                     const std::vector<std::string>& helper_args,
                                     const std::vector<std::string>& extra_flags = {}) {
    std::vector<std::string> args = {"--nnodes",      std::to_string(nnodes), "--node-rank",
                                     std::to_string(node), "--master-addr", "127.0.0.1",
                                     "--master-port", std::to_string(port_),  "-n",
                                     std::to_string(nprocs)};
    args.insert(args.end(), extra_flags.begin(), extra_flags.end());
    args.push_back("--");
    args.push_back(helper_path());
    args.insert(args.end(), helper_args.begin(), helper_args.end());
    return std::make_unique<Launch>(args);
  }

  // Node 0's rendezvous server: its launcher's first child (forked before anything else), once
  // it is there; 0 if it never came.
  static pid_t rendezvous_server_of(const Launch& node0) {
    const std::string children = "/proc/" + std::to_string(node0.pid()) + "/task/" +
                                 std::to_string(node0.pid()) + "/children";
    pid_t server = 0;
    wait_until(
        [&] {
          std::ifstream in(children);
          return static_cast<bool>(in >> server);
        },
        scaled(std::chrono::seconds(10)));
    return server;
  }

  // Node 0 said its own rendezvous server `server` `fate` ("is stopped by SIGSTOP").
  static void expect_server_named(const Launch& node0, pid_t server, const std::string& fate) {
    EXPECT_NE(node0.err().find(fmt::format("this node's rendezvous server (pid {}) {}: the job "
                                           "cannot go on without it",
                                           server, fate)),
              std::string::npos)
        << node0.err();
  }

  // Waits until `node` has printed `text`.
  static void wait_for_err(const Launch& node, const std::string& text) {
    ASSERT_TRUE(wait_until([&] { return node.err().find(text) != std::string::npos; },
                           scaled(std::chrono::seconds(30))))
        << node.err();
  }
  // Waits until `node`, its replicas ended, says (on SIGUSR1, sent until it answers) that it
  // waits for the other nodes to end `attempt`: its AttemptDone has been sent. A fixed pause
  // was too short when the node had not run since its replica died (a signal then met the
  // attempt still ending).
  static void wait_until_waiting(const Launch& node, int attempt = 0) {
    ask_until_said(node, fmt::format("which waits for the other nodes to end attempt {}", attempt),
                   std::chrono::milliseconds(500), scaled(std::chrono::seconds(20)));
  }
  // Sends `node` SIGUSR1 every `each` (the master's rendezvous answers once a second) until
  // it, or its rendezvous server, has printed `text`; at most for `total`. Not before the
  // launcher has printed its first line: until main() ignores it, SIGUSR1 kills.
  static void ask_until_said(const Launch& node, const std::string& text,
                             std::chrono::milliseconds each, std::chrono::milliseconds total) {
    ASSERT_NO_FATAL_FAILURE(wait_for_err(node, "xla-spawn: "));
    ASSERT_TRUE(wait_until(
        [&] {
          ::kill(node.pid(), SIGUSR1);
          return wait_until([&] { return node.err().find(text) != std::string::npos; }, each);
        },
        total))
        << node.err();
  }
  // Interrupts `node`, which waits for the other nodes, and once it has said so interrupts it
  // again past the repeat window (a second interrupt, not the first delivered twice).
  static void interrupt_twice_while_waiting(const Launch& node) {
    ::kill(node.pid(), SIGINT);
    wait_for_err(node, "received SIGINT while waiting");
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    ::kill(node.pid(), SIGINT);
  }

  const uint16_t port_ = cluster::pick_free_port("127.0.0.1");
  ScopedEnv token_{"XLA_SPAWN_JOB_TOKEN", "multi-node-test-token-0123"};
  // Short enough for the tests, long enough that a launcher the loaded machine leaves unrun
  // for a second is not counted lost; the tests of lost nodes set 1 s.
  ScopedEnv heartbeat_{"XLA_SPAWN_HEARTBEAT_TIMEOUT_MS", "4000"};
  TempDir pids_;
};

std::map<std::string, std::string> env_of(const std::string& out, int ordinal) {
  std::map<std::string, std::string> vars;
  for (const std::string& line : lines_with(out, "[" + std::to_string(ordinal) + "] ENV ")) {
    const std::string kv = line.substr(line.find("ENV ") + 4);
    vars[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  }
  return vars;
}

TEST_F(MultiNodeTest, ReplicasKnowTheirJobOrdinalTheirNodeAndTheMaster) {
  auto node0 = start_node(0, 2, 2, {"--do", "print-env"});
  auto node1 = start_node(1, 2, 3, {"--do", "print-env"});
  ASSERT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 0) << node1->err();
  ASSERT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 0) << node0->err();
  const auto zero = env_of(node0->out(), 1);
  EXPECT_EQ(zero.at("RANK"), "1");
  EXPECT_EQ(zero.at("LOCAL_RANK"), "1");
  EXPECT_EQ(zero.at("WORLD_SIZE"), "5");
  EXPECT_EQ(zero.at("LOCAL_WORLD_SIZE"), "2");
  const auto four = env_of(node1->out(), 4);
  EXPECT_EQ(four.at("XLA_SPAWN_ORDINAL"), "4");
  EXPECT_EQ(four.at("XLA_SPAWN_LOCAL_ORDINAL"), "2");
  EXPECT_EQ(four.at("XLA_SPAWN_LOCAL_WORLD_SIZE"), "3");
  EXPECT_EQ(four.at("XLA_SPAWN_NODE"), "1");
  EXPECT_EQ(four.at("GROUP_RANK"), "1");
  EXPECT_EQ(four.at("XLA_SPAWN_NNODES"), "2");
  EXPECT_EQ(four.at("GROUP_WORLD_SIZE"), "2");
  EXPECT_EQ(four.at("XLA_SPAWN_NODE_SIZES"), "2,3");
  EXPECT_EQ(four.at("XLA_SPAWN_MASTER_ADDR"), "127.0.0.1");
  EXPECT_EQ(four.at("XLA_SPAWN_MASTER_PORT"), std::to_string(port_));
  EXPECT_EQ(four.at("MASTER_ADDR"), "127.0.0.1");
  EXPECT_NE(four.at("MASTER_PORT"), std::to_string(port_));  // torch's own store, elsewhere
  EXPECT_EQ(four.at("XLA_SPAWN_JOB_ID"), zero.at("XLA_SPAWN_JOB_ID"));
  EXPECT_NE(four.at("XLA_SPAWN_SEGMENT"), zero.at("XLA_SPAWN_SEGMENT"));
}

// MASTER_PORT exported for torchrun is usually --master-port itself, where node 0's
// rendezvous listens: torch's store on rank 0 could not bind it, so the replicas get another.
TEST_F(MultiNodeTest, AnInheritedMasterPortThatIsTheRendezvousPortIsReplaced) {
  ScopedEnv master_port("MASTER_PORT", std::to_string(port_));
  auto node0 = start_node(0, 2, 1, {"--do", "print-env"});
  auto node1 = start_node(1, 2, 1, {"--do", "print-env"});
  ASSERT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 0) << node1->err();
  ASSERT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 0) << node0->err();
  const std::string torch_port = env_of(node0->out(), 0).at("MASTER_PORT");
  EXPECT_NE(torch_port, std::to_string(port_));
  EXPECT_EQ(env_of(node1->out(), 1).at("MASTER_PORT"), torch_port);
  EXPECT_NE(node0->err().find(fmt::format("MASTER_PORT={} in the environment is the rendezvous's "
                                          "--master-port; the replicas get MASTER_PORT={}",
                                          port_, torch_port)),
            std::string::npos)
      << node0->err();
}

// Nodes that share a filesystem (here: one directory) each write a timeline of their own.
TEST_F(MultiNodeTest, EachNodeWritesItsOwnTraceFile) {
  const std::string file = pids_ / "trace.json";
  auto node0 = start_node(0, 2, 1, {"--do", "print-env", "--then", "trace-span"}, {"--trace", file});
  auto node1 = start_node(1, 2, 2, {"--do", "print-env", "--then", "trace-span"}, {"--trace", file});
  ASSERT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 0) << node1->err();
  ASSERT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 0) << node0->err();
  EXPECT_EQ(env_of(node1->out(), 2).at("XLA_SPAWN_TRACE"), pids_ / "trace.node1.json");
  EXPECT_EQ(env_of(node0->out(), 0).at("XLA_SPAWN_TRACE"), pids_ / "trace.node0.json");
  EXPECT_NE(node1->err().find("written to " + pids_ / "trace.node1.json"), std::string::npos)
      << node1->err();
  EXPECT_TRUE(std::filesystem::exists(pids_ / "trace.node0.json"));
  EXPECT_FALSE(std::filesystem::exists(file));
}

TEST_F(MultiNodeTest, AFailureOnOneNodeStopsEveryNodeWithTheRootCausesStatus) {
  auto node0 = start_node(0, 2, 2, {"--pid-dir", pids_.path(), "--do", "sleep:30"});
  auto node1 = start_node(1, 2, 2,
                          {"--pid-dir", pids_.path(), "--wait-peers", "--do", "sleep:30",
                           "--for", "3=exit:3"});
  const int status1 = node1->wait_or_fail(scaled(seconds(30)));
  const int status0 = node0->wait_or_fail(scaled(seconds(30)));
  EXPECT_EQ(WEXITSTATUS(status1), 3) << node1->err();
  EXPECT_EQ(WEXITSTATUS(status0), 3) << node0->err();
  const std::string cause = "ordinal 3 (node 1, host ";
  EXPECT_NE(node0->err().find(cause), std::string::npos) << node0->err();
  EXPECT_NE(node0->err().find("local ordinal 1) exited with code 3"), std::string::npos) << node0->err();
  EXPECT_NE(node1->err().find(cause), std::string::npos) << node1->err();
  EXPECT_NE(node0->err().find("stopped by xla-spawn (not failures): ordinal(s) 0-1"),
            std::string::npos)
      << node0->err();
  for (pid_t pid : wait_for_pids(pids_.path(), 4, seconds(1))) EXPECT_FALSE(process_alive(pid));
}

TEST_F(MultiNodeTest, AKilledNodeIsLostAndEveryOtherNodeStopsWithinSeconds) {
  auto node0 = start_node(0, 2, 2, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  auto node1 = start_node(1, 2, 2, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  const std::vector<pid_t> replicas = wait_for_pids(pids_.path(), 4, scaled(seconds(30)));
  ASSERT_EQ(replicas.size(), 4u);
  const auto killed = Clock::now();
  ::kill(node1->pid(), SIGKILL);
  const int status0 = node0->wait_or_fail(scaled(seconds(30)));
  EXPECT_LT(node0->exit_time() - killed, scaled(seconds(10)));
  EXPECT_EQ(WEXITSTATUS(status0), 1) << node0->err();
  EXPECT_NE(node0->err().find("node 1 (host "), std::string::npos) << node0->err();
  EXPECT_NE(node0->err().find("127.0.0.1) lost: connection closed"), std::string::npos)
      << node0->err();
  // Node 1's replicas died with their launcher (parent-death signal).
  EXPECT_TRUE(wait_until([&] { return !process_alive(replicas[2]) && !process_alive(replicas[3]); },
                         scaled(seconds(10))));
}

TEST_F(MultiNodeTest, ANodeKilledWithUnreadHeartbeatsIsLostByAClosedConnection) {
  // Long enough that the stop below does not count as silence.
  ScopedEnv slow_heartbeat("XLA_SPAWN_HEARTBEAT_TIMEOUT_MS", "20000");
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  auto node1 = start_node(1, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  ASSERT_EQ(wait_for_pids(pids_.path(), 2, scaled(seconds(30))).size(), 2u);
  // Stopped, node 1 leaves the master's heartbeats unread in its socket; killed then, its
  // kernel resets the connection instead of closing it, which must read as the same loss.
  ::kill(node1->pid(), SIGSTOP);
  std::this_thread::sleep_for(milliseconds(1500));  // the stop's length: ~6 heartbeats queue up
  ::kill(node1->pid(), SIGKILL);
  EXPECT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 1) << node0->err();
  EXPECT_NE(node0->err().find("127.0.0.1) lost: connection closed"), std::string::npos)
      << node0->err();
}

TEST_F(MultiNodeTest, AFrozenNodeIsLostWithinTheHeartbeatTimeout) {
  ScopedEnv fast_heartbeat("XLA_SPAWN_HEARTBEAT_TIMEOUT_MS", "1000");
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  auto node1 = start_node(1, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  const std::vector<pid_t> replicas = wait_for_pids(pids_.path(), 2, scaled(seconds(30)));
  ASSERT_EQ(replicas.size(), 2u);
  const auto stopped = Clock::now();
  ::kill(node1->pid(), SIGSTOP);
  const int status0 = node0->wait_or_fail(scaled(seconds(30)));
  EXPECT_LT(node0->exit_time() - stopped, scaled(seconds(10)));
  EXPECT_EQ(WEXITSTATUS(status0), 1) << node0->err();
  EXPECT_NE(node0->err().find("lost: no heartbeat for"), std::string::npos) << node0->err();
  // Resumed, node 1 finds its master gone, stops its replica and fails too, saying the
  // silence was its own, as the master's last word told it (it used to blame the master: "its
  // xla-spawn exited or was killed").
  ::kill(node1->pid(), SIGCONT);
  const int status1 = node1->wait_or_fail(scaled(seconds(30)));
  EXPECT_NE(WEXITSTATUS(status1), 0) << node1->err();
  EXPECT_NE(node1->err().find(") counted this node lost: no heartbeat for "), std::string::npos)
      << node1->err();
  EXPECT_EQ(node1->err().find("its xla-spawn exited or was killed"), std::string::npos)
      << node1->err();
  EXPECT_FALSE(process_alive(replicas[1]));
}

// Node 0's launcher stopped (its server runs on): the server counts node 0 lost and ends the
// job; node 0, resumed, must not blame its server's exit, which followed from its own silence.
TEST_F(MultiNodeTest, AStoppedMasterNodeSaysItWasCountedLost) {
  ScopedEnv fast_heartbeat("XLA_SPAWN_HEARTBEAT_TIMEOUT_MS", "1000");
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  auto node1 = start_node(1, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  ASSERT_EQ(wait_for_pids(pids_.path(), 2, scaled(seconds(30))).size(), 2u);
  ::kill(node0->pid(), SIGSTOP);
  EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 1) << node1->err();
  ::kill(node0->pid(), SIGCONT);
  EXPECT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 1) << node0->err();
  EXPECT_NE(node0->err().find(") counted this node lost: no heartbeat for "), std::string::npos)
      << node0->err();
  EXPECT_EQ(node0->err().find("rendezvous server (pid"), std::string::npos) << node0->err();
}

// Node 0's own rendezvous server dying is named as such on node 0 (it said it had lost "the
// master ... its xla-spawn exited or was killed", which is node 0 itself).
TEST_F(MultiNodeTest, TheMastersOwnServerDyingIsNamedOnTheMaster) {
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  auto node1 = start_node(1, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  ASSERT_EQ(wait_for_pids(pids_.path(), 2, scaled(seconds(30))).size(), 2u);
  const pid_t server = rendezvous_server_of(*node0);
  ASSERT_EQ(read_file("/proc/" + std::to_string(server) + "/comm"), "xla-spawn-rdzv\n");
  ::kill(server, SIGKILL);
  EXPECT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 1) << node0->err();
  expect_server_named(*node0, server, "was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 1) << node1->err();
  EXPECT_NE(node1->err().find("lost the master"), std::string::npos) << node1->err();
}

// The same while the job forms: node 0's server stopped, node 0 hears no heartbeat and names
// its server (it said it had lost "the master (node 0 at ...)", itself), and does not wait
// for the stopped process to exit.
TEST_F(MultiNodeTest, TheMastersOwnServerStoppedDuringTheRendezvousIsNamed) {
  ScopedEnv fast_heartbeat("XLA_SPAWN_HEARTBEAT_TIMEOUT_MS", "1000");
  auto node0 = start_node(0, 2, 1, {"--do", "exit:0"}, {"--rdzv-timeout", "60"});
  const pid_t server = rendezvous_server_of(*node0);
  ASSERT_GT(server, 0) << "the rendezvous server never started";
  ASSERT_NO_FATAL_FAILURE(ask_until_said(*node0, "1 of 2 nodes registered (0)", milliseconds(1200),
                                         scaled(seconds(10))));
  ASSERT_EQ(::kill(server, SIGSTOP), 0);
  EXPECT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(20)))), 1) << node0->err();
  expect_server_named(*node0, server, "is stopped by SIGSTOP");
  EXPECT_TRUE(wait_until([&] { return !process_alive(server); }, scaled(seconds(5))));
}

// A node stopped after it registered, while the job formed without it, is counted lost; run
// again, it finds that behind World and leaves without starting its replicas (it used to say
// the job formed, start them, and stop them).
TEST_F(MultiNodeTest, ANodeStoppedWhileTheJobFormsLeavesWithoutStartingItsReplicas) {
  ScopedEnv fast_heartbeat("XLA_SPAWN_HEARTBEAT_TIMEOUT_MS", "1000");
  auto node0 = start_node(0, 3, 1, {"--pid-dir", pids_.path(), "--do", "exit:0"});
  auto node1 = start_node(1, 3, 1, {"--pid-dir", pids_.path(), "--do", "exit:0"});
  ASSERT_NO_FATAL_FAILURE(ask_until_said(*node0, "2 of 3 nodes registered (0-1)",
                                         milliseconds(1200), scaled(seconds(10))));
  ASSERT_EQ(::kill(node1->pid(), SIGSTOP), 0);
  auto node2 = start_node(2, 3, 1, {"--pid-dir", pids_.path(), "--do", "exit:0"});
  EXPECT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 1) << node0->err();
  EXPECT_NE(node0->err().find("node 1 (host "), std::string::npos) << node0->err();
  ASSERT_EQ(::kill(node1->pid(), SIGCONT), 0);
  EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 1) << node1->err();
  EXPECT_NE(node1->err().find(") counted this node lost: no heartbeat for "), std::string::npos)
      << node1->err();
  EXPECT_EQ(node1->err().find("formed"), std::string::npos) << node1->err();
  EXPECT_FALSE(std::filesystem::exists(pids_ / "pid.1")) << "node 1 started its replica";
  node2->wait_or_fail(scaled(seconds(30)));
}

TEST_F(MultiNodeTest, TheRendezvousTimeoutNamesTheNodesThatNeverCame) {
  auto node0 = start_node(0, 3, 1, {"--do", "exit:0"}, {"--rdzv-timeout", "3"});
  auto node2 = start_node(2, 3, 1, {"--do", "exit:0"}, {"--rdzv-timeout", "30"});
  const int status0 = node0->wait_or_fail(scaled(seconds(30)));
  const int status2 = node2->wait_or_fail(scaled(seconds(30)));
  EXPECT_EQ(WEXITSTATUS(status0), 1) << node0->err();
  EXPECT_EQ(WEXITSTATUS(status2), 1) << node2->err();
  EXPECT_NE(node0->err().find("node(s) 1 never registered (2 of 3 did"), std::string::npos)
      << node0->err();
  EXPECT_NE(node2->err().find("node(s) 1 never registered"), std::string::npos) << node2->err();
}

// A node with a bad segment setting fails at once, before it joins: not after every node has
// come (or at the rendezvous deadline, when the master is not there yet).
TEST_F(MultiNodeTest, ABadSegmentSettingFailsTheNodeBeforeItJoins) {
  ScopedEnv arena("XLA_SPAWN_ARENA_BYTES", "lots");
  auto node1 = start_node(1, 2, 1, {"--do", "exit:0"}, {"--rdzv-timeout", "60"});
  const int status = node1->wait_or_fail(scaled(seconds(10)));
  EXPECT_EQ(WEXITSTATUS(status), 2) << node1->err();
  EXPECT_NE(node1->err().find("XLA_SPAWN_ARENA_BYTES='lots': expected an integer"),
            std::string::npos)
      << node1->err();
  EXPECT_EQ(node1->err().find("joining the job"), std::string::npos) << node1->err();
}

// kill -USR1 (the hang report) during the rendezvous, to the launcher and to its rendezvous
// server (as `kill -USR1 %1` reaches the job's group): neither dies of it, the master says
// where the rendezvous stands, and the rendezvous still ends with its own timeout.
TEST_F(MultiNodeTest, SigusrOneDuringTheRendezvousKillsNeitherTheLauncherNorItsServer) {
  auto node0 = start_node(0, 2, 1, {"--do", "exit:0"}, {"--rdzv-timeout", "6"});
  const pid_t server = rendezvous_server_of(*node0);
  ASSERT_GT(server, 0) << "the rendezvous server never started";
  ASSERT_EQ(::kill(node0->pid(), SIGUSR1), 0);
  ::kill(server, SIGUSR1);
  // The first may meet the server still starting (the launcher not yet knowing its pid, the
  // server not yet listening for the signal); asked again, the master answers.
  EXPECT_NO_FATAL_FAILURE(ask_until_said(
      *node0, "xla-spawn rendezvous: 1 of 2 nodes registered (0); waiting for node(s) 1; ",
      milliseconds(1200), scaled(seconds(4))));
  const int status = node0->wait_or_fail(scaled(seconds(30)));
  ASSERT_TRUE(WIFEXITED(status)) << status << node0->err();
  EXPECT_EQ(WEXITSTATUS(status), 1) << node0->err();
  EXPECT_NE(node0->err().find("node(s) 1 never registered"), std::string::npos) << node0->err();
}

// Ctrl-C on a node waiting in the rendezvous: it says so and dies by the signal; the master,
// at its deadline, names the node as one that registered and left.
TEST_F(MultiNodeTest, CtrlCDuringTheRendezvousIsSaidAndTheMasterNamesTheNodeThatLeft) {
  auto node0 = start_node(0, 3, 1, {"--do", "exit:0"}, {"--rdzv-timeout", "5"});
  auto node1 = start_node(1, 3, 1, {"--do", "exit:0"}, {"--rdzv-timeout", "5"});
  ASSERT_TRUE(wait_until([&] { return node1->err().find("joining the job") != std::string::npos; },
                         scaled(seconds(10))))
      << node1->err();
  // SIGUSR1: node 1 says it waits, once a second at most however many come; the master,
  // asked until it says so, that node 1 has come.
  const auto flood = std::chrono::steady_clock::now();
  for (int k = 0; k < 300; ++k) ASSERT_EQ(::kill(node1->pid(), SIGUSR1), 0);
  const auto flooded = std::chrono::steady_clock::now() - flood;
  ASSERT_NO_FATAL_FAILURE(wait_for_err(*node1, "received SIGUSR1: waiting in the rendezvous"));
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_LE(lines_with(node1->err(), "xla-spawn: received SIGUSR1").size(),
            2 + static_cast<size_t>(std::chrono::duration_cast<seconds>(flooded).count()))
      << node1->err();
  ASSERT_NO_FATAL_FAILURE(ask_until_said(
      *node0, "xla-spawn rendezvous: 2 of 3 nodes registered (0-1); waiting for node(s) 2; ",
      milliseconds(1200), scaled(seconds(4))));
  ASSERT_EQ(::kill(node1->pid(), SIGINT), 0);
  const int status1 = node1->wait_or_fail(scaled(seconds(10)));
  EXPECT_TRUE(WIFSIGNALED(status1) && WTERMSIG(status1) == SIGINT) << status1;
  EXPECT_NE(node1->err().find("interrupted during the rendezvous; no replica was started"),
            std::string::npos)
      << node1->err();
  const int status0 = node0->wait_or_fail(scaled(seconds(30)));
  EXPECT_EQ(WEXITSTATUS(status0), 1) << node0->err();
  EXPECT_NE(node0->err().find("node(s) 2 never registered; node 1 (host "), std::string::npos)
      << node0->err();
  EXPECT_NE(node0->err().find("registered and then left"), std::string::npos) << node0->err();
}

TEST_F(MultiNodeTest, AWrongTokenAndATakenNodeRankAreRefusedWithAClearError) {
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  auto node1 = start_node(1, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  ASSERT_EQ(wait_for_pids(pids_.path(), 2, scaled(seconds(30))).size(), 2u);
  const std::vector<std::string> second_node1 = {
      "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
      std::to_string(port_), "-n", "1", "--", helper_path(), "--do", "exit:0"};
  {
    ScopedEnv other("XLA_SPAWN_JOB_TOKEN", "some-other-jobs-token-4567");
    const RunResult wrong = run_xla_spawn(second_node1);
    EXPECT_EQ(wrong.exit_code, 1) << wrong.err;
    EXPECT_NE(wrong.err.find("wrong job token"), std::string::npos) << wrong.err;
  }
  const RunResult taken = run_xla_spawn(second_node1);
  EXPECT_EQ(taken.exit_code, 1) << taken.err;
  EXPECT_NE(taken.err.find("node rank 1 is already taken by host"), std::string::npos) << taken.err;
  // The job itself was not disturbed.
  EXPECT_FALSE(node0->wait_for(milliseconds(0)));
  ::kill(node0->pid(), SIGINT);
  EXPECT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 130) << node0->err();
  EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 130) << node1->err();
}

TEST_F(MultiNodeTest, ARestartRunsEveryNodesReplicasAgain) {
  auto node0 = start_node(0, 2, 2, {"--do", "print-env"}, {"--max-restarts", "1"});
  auto node1 = start_node(1, 2, 2, {"--do", "print-env", "--for", "3=fail-attempts:1:3"},
                          {"--max-restarts", "1"});
  EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 0) << node1->err();
  EXPECT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 0) << node0->err();
  for (const Launch* node : {node0.get(), node1.get()}) {
    EXPECT_NE(node->err().find("restarting all replicas of the job on every node: attempt 1"),
              std::string::npos)
        << node->err();
  }
  EXPECT_NE(node0->out().find("[0] ENV XLA_SPAWN_ATTEMPT=1"), std::string::npos) << node0->out();
}

TEST_F(MultiNodeTest, ACtrlCOnOneNodeInterruptsTheWholeJob) {
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  auto node1 = start_node(1, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:60"});
  ASSERT_EQ(wait_for_pids(pids_.path(), 2, scaled(seconds(30))).size(), 2u);
  ::kill(node1->pid(), SIGINT);
  EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 130) << node1->err();
  EXPECT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 130) << node0->err();
  EXPECT_NE(node0->err().find("was interrupted by SIGINT"), std::string::npos) << node0->err();
}

// A scheduler (scancel, a time limit) sends SIGTERM to every node's xla-spawn at once: the node
// that hears of another node's signal first must take its own as its first, keeping the grace
// period, not as a second one that kills.
TEST_F(MultiNodeTest, ASignalToEveryNodeIsEachNodesFirst) {
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "ignore-all:30"},
                          {"--grace-period", "60"});
  auto node1 = start_node(1, 2, 1, {"--pid-dir", pids_.path(), "--do", "ignore-all:30"},
                          {"--grace-period", "60"});
  const std::vector<pid_t> pids = wait_for_pids(pids_.path(), 2, scaled(seconds(30)));
  ASSERT_EQ(pids.size(), 2u);
  ::kill(node0->pid(), SIGTERM);
  ASSERT_TRUE(wait_until(
      [&] { return node1->err().find("was interrupted by SIGTERM") != std::string::npos; },
      scaled(seconds(10))))
      << node1->err();
  ::kill(node1->pid(), SIGTERM);
  ASSERT_TRUE(wait_until(
      [&] { return node1->err().find("received SIGTERM") != std::string::npos; },
      scaled(seconds(10))))
      << node1->err();
  EXPECT_NE(node1->err().find("received SIGTERM while already stopping 1 replica(s); no restart"),
            std::string::npos)
      << node1->err();
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(node1->err().find("killing"), std::string::npos) << node1->err();
  for (pid_t pid : pids) EXPECT_TRUE(process_alive(pid)) << "ignores SIGTERM: must still run";
  // A second signal, past the repeat window, kills on each node.
  std::this_thread::sleep_for(milliseconds(600));
  for (Launch* node : {node0.get(), node1.get()}) ::kill(node->pid(), SIGTERM);
  EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 143) << node1->err();
  EXPECT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 143) << node0->err();
  EXPECT_NE(node1->err().find("received SIGTERM again; killing"), std::string::npos)
      << node1->err();
}

// A node whose replicas have ended waits for the others (here node 0's replica sleeps on):
// an interrupt there stops the job on every node, with the interrupt as the root cause, and a
// second one leaves at once. Before, both went unheard until the job ended elsewhere.
TEST_F(MultiNodeTest, AnInterruptWhileANodeWaitsForTheOthersStopsTheJob) {
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:60"},
                          {"--max-restarts", "1", "--grace-period", "1"});
  auto node1 = start_node(1, 2, 1, {"--pid-dir", pids_.path(), "--do", "exit:0"},
                          {"--max-restarts", "1", "--grace-period", "1"});
  const std::vector<pid_t> pids = wait_for_pids(pids_.path(), 2, scaled(seconds(30)));
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_TRUE(wait_until([&] { return !process_alive(pids[1]); }, scaled(seconds(20))));
  ASSERT_NO_FATAL_FAILURE(wait_until_waiting(*node1));
  EXPECT_NE(node1->err().find("no replica runs on this node"), std::string::npos) << node1->err();
  ::kill(node1->pid(), SIGINT);
  const int status0 = node0->wait_or_fail(scaled(seconds(20)));
  const int status1 = node1->wait_or_fail(scaled(seconds(20)));
  EXPECT_EQ(WEXITSTATUS(status0), 130) << node0->err();
  EXPECT_EQ(WEXITSTATUS(status1), 130) << node1->err();
  EXPECT_NE(node1->err().find("received SIGINT while waiting for the other nodes; stopping the "
                              "job on every node"),
            std::string::npos)
      << node1->err();
  EXPECT_NE(node0->err().find("was interrupted by SIGINT while waiting for the other nodes"),
            std::string::npos)
      << node0->err();
  EXPECT_EQ(node0->err().find("restarting"), std::string::npos) << node0->err();
  EXPECT_FALSE(process_alive(pids[0]));
}

// The same, and node 0's replica ignores SIGTERM for long: a second interrupt leaves at once.
TEST_F(MultiNodeTest, ASecondInterruptWhileANodeWaitsLeavesAtOnce) {
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "ignore-term:30"},
                          {"--grace-period", "30"});
  auto node1 = start_node(1, 2, 1, {"--pid-dir", pids_.path(), "--do", "exit:0"},
                          {"--grace-period", "30"});
  const std::vector<pid_t> pids = wait_for_pids(pids_.path(), 2, scaled(seconds(30)));
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_TRUE(wait_until([&] { return !process_alive(pids[1]); }, scaled(seconds(20))));
  ASSERT_NO_FATAL_FAILURE(wait_until_waiting(*node1));
  ASSERT_NO_FATAL_FAILURE(interrupt_twice_while_waiting(*node1));
  const int status1 = node1->wait_or_fail(scaled(seconds(10)));
  EXPECT_EQ(WEXITSTATUS(status1), 130) << node1->err();
  EXPECT_NE(node1->err().find("received SIGINT again; left without the job's verdict"),
            std::string::npos)
      << node1->err();
  // Node 0 keeps the grace period for its own first interrupt; its second kills now.
  ::kill(node0->pid(), SIGINT);
  ASSERT_TRUE(wait_until(
      [&] { return node0->err().find("received SIGINT") != std::string::npos; },
      scaled(seconds(10))))
      << node0->err();
  std::this_thread::sleep_for(milliseconds(600));
  ::kill(node0->pid(), SIGINT);
  const int status0 = node0->wait_or_fail(scaled(seconds(20)));
  EXPECT_NE(WEXITSTATUS(status0), 0) << node0->err();
  EXPECT_FALSE(process_alive(pids[0]));
}

// Node 1's replica failed (exit 3) and node 1 waits while node 0's replica takes its grace
// period: an interrupt there prevents the restart but the failure stays the root cause, its
// status the job's (the interrupt had taken both).
TEST_F(MultiNodeTest, AnInterruptWhileANodeWaitsAfterItsFailureKeepsTheFailuresStatus) {
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "ignore-term:20"},
                          {"--max-restarts", "1", "--grace-period", "4"});
  auto node1 = start_node(1, 2, 1, {"--pid-dir", pids_.path(), "--wait-peers", "--do", "exit:3"},
                          {"--max-restarts", "1", "--grace-period", "4"});
  ASSERT_NO_FATAL_FAILURE(wait_for_err(*node0, "exited with code 3; stopping"));
  std::this_thread::sleep_for(milliseconds(500));  // node 1 is waiting for the verdict
  ::kill(node1->pid(), SIGTERM);
  const int status1 = node1->wait_or_fail(scaled(seconds(30)));
  const int status0 = node0->wait_or_fail(scaled(seconds(30)));
  EXPECT_EQ(WEXITSTATUS(status0), 3) << node0->err();
  EXPECT_EQ(WEXITSTATUS(status1), 3) << node1->err();
  for (const Launch* node : {node0.get(), node1.get()}) {
    EXPECT_EQ(node->err().find("restarting"), std::string::npos) << node->err();
    EXPECT_NE(node->err().find("failed after"), std::string::npos) << node->err();
    EXPECT_NE(node->err().find("exited with code 3"), std::string::npos) << node->err();
  }
}

// The master decides to restart before it hears of an interrupt on a waiting node (here node 1
// is stopped, waiting for the verdict, while node 0 ends its attempt and the master sends Next;
// it is interrupted and continued with Next in its socket): the interrupt stops the next
// attempt at once, on every node, instead of being dropped as a stale report and the job
// restarted to the end.
TEST_F(MultiNodeTest, AnInterruptTheMasterHearsTooLateStopsTheNextAttempt) {
  ScopedEnv slow_heartbeat("XLA_SPAWN_HEARTBEAT_TIMEOUT_MS", "20000");  // node 1 pauses
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "ignore-term:20"},
                          {"--max-restarts", "1", "--grace-period", "2"});
  auto node1 = start_node(1, 2, 1,
                          {"--pid-dir", pids_.path(), "--wait-peers", "--do", "fail-attempts:1:3"},
                          {"--max-restarts", "1", "--grace-period", "2"});
  ASSERT_NO_FATAL_FAILURE(wait_for_err(*node0, "exited with code 3; stopping"));
  ASSERT_NO_FATAL_FAILURE(wait_until_waiting(*node1));
  ASSERT_EQ(::kill(node1->pid(), SIGSTOP), 0);
  // Node 0's replica dies of the SIGKILL after the grace period; the master, having both
  // AttemptDones, sends Next to every node in one go.
  ASSERT_NO_FATAL_FAILURE(
      wait_for_err(*node0, "restarting all replicas of the job on every node: attempt 1"));
  std::this_thread::sleep_for(milliseconds(300));
  ::kill(node1->pid(), SIGINT);
  ASSERT_EQ(::kill(node1->pid(), SIGCONT), 0);
  const int status1 = node1->wait_or_fail(scaled(seconds(30)));
  const int status0 = node0->wait_or_fail(scaled(seconds(30)));
  EXPECT_EQ(WEXITSTATUS(status0), 130) << node0->err();
  EXPECT_EQ(WEXITSTATUS(status1), 130) << node1->err();
  EXPECT_NE(node1->err().find("the job had decided to restart before it heard of the SIGINT"),
            std::string::npos)
      << node1->err();
}

// Signals pending on a waiting node when the job's verdict (End, status 0) arrives do not
// undo it: two different ones (a scheduler's SIGTERM with a hangup) made it leave "without the
// job's verdict" (143), one said it was stopping a job that had ended.
TEST_F(MultiNodeTest, SignalsPendingAsTheVerdictArrivesDoNotUndoIt) {
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "sleep:3"});
  auto node1 = start_node(1, 2, 1, {"--pid-dir", pids_.path(), "--do", "exit:0"});
  ASSERT_EQ(wait_for_pids(pids_.path(), 2, scaled(seconds(30))).size(), 2u);
  ASSERT_NO_FATAL_FAILURE(wait_until_waiting(*node1));
  ASSERT_EQ(::kill(node1->pid(), SIGSTOP), 0);
  EXPECT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 0) << node0->err();
  ::kill(node1->pid(), SIGINT);
  ::kill(node1->pid(), SIGTERM);
  ASSERT_EQ(::kill(node1->pid(), SIGCONT), 0);
  EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 0) << node1->err();
  EXPECT_EQ(node1->err().find("without the job's verdict"), std::string::npos) << node1->err();
  EXPECT_EQ(node1->err().find("stopping the job on every node"), std::string::npos) << node1->err();
}

// A node whose replica failed (exit 3) leaves on a second interrupt with that failure's status
// and summary, not 128 + the signal.
TEST_F(MultiNodeTest, ASecondInterruptWhileANodeWaitsAfterItsFailureLeavesWithItsStatus) {
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "ignore-term:30"},
                          {"--grace-period", "30"});
  auto node1 = start_node(1, 2, 1, {"--pid-dir", pids_.path(), "--wait-peers", "--do", "exit:3"},
                          {"--grace-period", "30"});
  ASSERT_NO_FATAL_FAILURE(wait_for_err(*node0, "exited with code 3; stopping"));
  ASSERT_NO_FATAL_FAILURE(wait_until_waiting(*node1));
  ASSERT_NO_FATAL_FAILURE(interrupt_twice_while_waiting(*node1));
  EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(10)))), 3) << node1->err();
  EXPECT_NE(node1->err().find("exited with code 3"), std::string::npos) << node1->err();
  for (int k = 0; k < 2; ++k) {  // node 0: its own interrupts, the second kills now
    ::kill(node0->pid(), SIGINT);
    std::this_thread::sleep_for(milliseconds(600));
  }
  EXPECT_NE(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(20)))), 0) << node0->err();
}

// Node 0 (the master) waits while node 1's replica ignores SIGTERM for long: its second
// interrupt leaves at once, without waiting out the rendezvous server's linger.
TEST_F(MultiNodeTest, TheMastersSecondInterruptWhileWaitingLeavesAtOnce) {
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--do", "exit:0"},
                          {"--grace-period", "30"});
  auto node1 = start_node(1, 2, 1, {"--pid-dir", pids_.path(), "--do", "ignore-term:30"},
                          {"--grace-period", "2"});
  const std::vector<pid_t> pids = wait_for_pids(pids_.path(), 2, scaled(seconds(30)));
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_TRUE(wait_until([&] { return !process_alive(pids[0]); }, scaled(seconds(20))));
  ASSERT_NO_FATAL_FAILURE(wait_until_waiting(*node0));
  ASSERT_NO_FATAL_FAILURE(interrupt_twice_while_waiting(*node0));
  const auto second = std::chrono::steady_clock::now();
  EXPECT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(20)))), 130) << node0->err();
  EXPECT_LT(std::chrono::steady_clock::now() - second, scaled(seconds(3))) << node0->err();
  // Node 1 loses its master and stops its replica (SIGKILL after its 2 s grace period).
  EXPECT_NE(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(20)))), 0) << node1->err();
  EXPECT_NE(node1->err().find("lost the master"), std::string::npos) << node1->err();
  EXPECT_FALSE(process_alive(pids[1]));
}

// Node 1 is interrupted while the job stops for node 0's failure: the job restarts nothing
// on any node, although --max-restarts allows it.
TEST_F(MultiNodeTest, AnInterruptWhileTheJobStopsForAFailureEndsItOnEveryNode) {
  auto node0 = start_node(0, 2, 1, {"--pid-dir", pids_.path(), "--wait-peers", "--do", "exit:3"},
                          {"--max-restarts", "1", "--grace-period", "3"});
  auto node1 = start_node(1, 2, 1,
                          {"--pid-dir", pids_.path(), "--wait-peers", "--do", "ignore-term:15"},
                          {"--max-restarts", "1", "--grace-period", "3"});
  ASSERT_NO_FATAL_FAILURE(wait_for_err(*node1, "exited with code 3; stopping"));
  ::kill(node1->pid(), SIGINT);
  const int status1 = node1->wait_or_fail(scaled(seconds(30)));
  const int status0 = node0->wait_or_fail(scaled(seconds(30)));
  for (const Launch* node : {node0.get(), node1.get()}) {
    EXPECT_EQ(node->err().find("restarting"), std::string::npos) << node->err();
  }
  // The failure keeps its status: the interrupt came after it.
  EXPECT_EQ(WEXITSTATUS(status0), 3) << node0->err();
  EXPECT_EQ(WEXITSTATUS(status1), 3) << node1->err();
  EXPECT_NE(node1->err().find("received SIGINT while already stopping 1 replica(s); no restart"),
            std::string::npos)
      << node1->err();
}

TEST_F(MultiNodeTest, ANodeRunningAnotherCommandIsNotedOnEveryNode) {
  auto node0 = start_node(0, 2, 1, {"--do", "exit:0"});
  auto node1 = start_node(1, 2, 1, {"--do", "exit:0", "--for", "9=it's other"});
  ASSERT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 0) << node1->err();
  ASSERT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 0) << node0->err();
  const std::string note = fmt::format(
      "runs `{0} --do exit:0 --for '9=it'\\''s other'`, node 0 `{0} --do exit:0`: if that node "
      "belongs to another job on this port, stop both",
      helper_path());
  for (const Launch* node : {node0.get(), node1.get()}) {
    EXPECT_NE(node->err().find("xla-spawn: note: node 1 (host "), std::string::npos) << node->err();
    EXPECT_NE(node->err().find(note), std::string::npos) << node->err();
  }
}

// Each side beats at a quarter of its own timeout: a node with a shorter one declared the
// master lost within a second of the job forming.
TEST_F(MultiNodeTest, ANodeWithAnotherHeartbeatTimeoutIsRefusedBeforeTheJobForms) {
  ScopedEnv master_heartbeat("XLA_SPAWN_HEARTBEAT_TIMEOUT_MS", "1000");
  auto node0 = start_node(0, 2, 1, {"--do", "exit:0"}, {"--rdzv-timeout", "3"});
  ScopedEnv heartbeat("XLA_SPAWN_HEARTBEAT_TIMEOUT_MS", "3000");
  auto node1 = start_node(1, 2, 1, {"--do", "exit:0"});
  EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 1) << node1->err();
  EXPECT_NE(node1->err().find("has XLA_SPAWN_HEARTBEAT_TIMEOUT_MS 3000, the master 1000: set it "
                              "alike on every node"),
            std::string::npos)
      << node1->err();
  EXPECT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 1) << node0->err();
  EXPECT_EQ(node1->out() + node0->out(), "");
}

// A wrong XLA_SPAWN_HOST_ADDR used to pass the rendezvous and fail every replica's gloo set-up
// after the job had formed; node 0 need not be there to hear it. (Numeric addresses only: a
// name would be asked of DNS.)
TEST_F(MultiNodeTest, AHostAddressThatIsNotThisHostsIsRefusedBeforeTheJobForms) {
  for (const char* address : {"198.18.255.254", "192.0.2.1"}) {
    ScopedEnv host_addr("XLA_SPAWN_HOST_ADDR", address);
    auto node1 = start_node(1, 2, 1, {"--do", "print-env"});
    EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 2) << node1->err();
    EXPECT_NE(node1->err().find(fmt::format("XLA_SPAWN_HOST_ADDR={}: ", address)), std::string::npos)
        << node1->err();
    EXPECT_NE(node1->err().find("it must be an address of this host, where its replicas listen"),
              std::string::npos)
        << node1->err();
    EXPECT_EQ(node1->out(), "");
  }
  // Binding the wildcard succeeds; the other nodes would reach their own host at it.
  ScopedEnv wildcard("XLA_SPAWN_HOST_ADDR", "0.0.0.0");
  auto node1 = start_node(1, 2, 1, {"--do", "print-env"});
  EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 2) << node1->err();
  EXPECT_NE(node1->err().find("XLA_SPAWN_HOST_ADDR=0.0.0.0 is the wildcard address"),
            std::string::npos)
      << node1->err();
}

// A node may start before its master's name is in DNS (a record made as the job starts): it
// looks the name up again until the rendezvous timeout. Node 1 runs in a mount namespace of
// its own whose /etc/hosts the test writes, and whose nsswitch.conf reads only that file, so
// nothing is asked of a DNS server.
class MasterNameTest : public MultiNodeTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0 || !std::filesystem::exists("/usr/bin/unshare")) {
      GTEST_SKIP() << "needs root and /usr/bin/unshare: gives node 1 an /etc/hosts of its own "
                      "in a private mount namespace";
    }
    std::ofstream(names_ / "hosts") << "127.0.0.1 localhost\n";
    std::ofstream(names_ / "nsswitch.conf") << "hosts: files\n";
  }

  // Node 1 of 2 with one replica printing its environment, told the master is `name`.
  std::unique_ptr<Launch> start_node1_for(const std::string& name,
                                          const std::string& rdzv_timeout) {
    const std::string dir = names_.path();
    return std::make_unique<Launch>(
        std::vector<std::string>{
            "/usr/bin/unshare", "-m", "/bin/sh", "-c",
            fmt::format("mount --bind {0}/hosts /etc/hosts && mount --bind {0}/nsswitch.conf "
                        "/etc/nsswitch.conf && exec {1} --nnodes 2 --node-rank 1 --master-addr "
                        "{2} --master-port {3} --rdzv-timeout {4} -n 1 -- {5} --do print-env",
                        dir, xla_spawn_path(), name, port_, rdzv_timeout, helper_path())},
        true);
  }

  void add_name(const std::string& name) {
    std::ofstream(names_ / "hosts", std::ios::app) << "127.0.0.1 " << name << "\n";
  }

  TempDir names_;
};

TEST_F(MasterNameTest, ANameThatResolvesLateIsLookedUpAgainAndTheJobForms) {
  auto node1 = start_node1_for("xs-late-master", "60");
  ASSERT_NO_FATAL_FAILURE(wait_for_err(
      *node1, "node 1: cannot resolve 'xs-late-master' (port " + std::to_string(port_) +
                  "): Name or service not known; trying again until the rendezvous timeout"));
  add_name("xs-late-master");
  auto node0 = start_node(0, 2, 1, {"--do", "print-env"});
  ASSERT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 0) << node1->err();
  ASSERT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 0) << node0->err();
  EXPECT_EQ(env_of(node1->out(), 1).at("MASTER_ADDR"), "xs-late-master");
}

// What can never resolve is refused at once (exit 2), not retried for the rendezvous timeout.
TEST_F(MasterNameTest, WhatIsNoHostNameIsRefusedAtOnce) {
  for (const char* address : {"127.0.0.1:29500", "[::1]", "a..b"}) {
    const auto start = std::chrono::steady_clock::now();
    auto node1 = start_node1_for(fmt::format("'{}'", address), "60");
    EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 2) << node1->err();
    EXPECT_LT(std::chrono::steady_clock::now() - start, scaled(seconds(10)));
    EXPECT_NE(node1->err().find(fmt::format("'{}' is neither a host name nor an address", address)),
              std::string::npos)
        << node1->err();
    EXPECT_EQ(node1->err().find("trying again"), std::string::npos) << node1->err();
  }
}

TEST_F(MasterNameTest, ANameThatNeverResolvesEndsTheNodeAtTheRendezvousTimeout) {
  const auto start = std::chrono::steady_clock::now();
  auto node1 = start_node1_for("xs-no-such-master", "2");
  const int status = node1->wait_or_fail(scaled(seconds(30)));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(WEXITSTATUS(status), 1) << node1->err();
  EXPECT_GE(took, 2.0);
  EXPECT_NE(node1->err().find("cannot resolve 'xs-no-such-master' (port " +
                              std::to_string(port_) +
                              "): Name or service not known (tried for 2 s, the rendezvous "
                              "timeout): is --master-addr node 0's name?"),
            std::string::npos)
      << node1->err();
  EXPECT_EQ(node1->out(), "");  // no replica started
}

// A node whose host has no route to the master yet (its network not up) tries again until
// the rendezvous timeout; it used to fail at once, and the master waited out its timeout for
// it. Node 1 starts in a network namespace of its own whose loopback is down; once it has
// said it waits, the loopback comes up and node 0 starts in the same namespace.
TEST_F(MultiNodeTest, ANodeWithoutARouteToTheMasterYetTriesAgainAndTheJobForms) {
  const char* const ip = std::filesystem::exists("/usr/sbin/ip") ? "/usr/sbin/ip" : "/sbin/ip";
  if (::geteuid() != 0 || !std::filesystem::exists("/usr/bin/unshare") ||
      !std::filesystem::exists("/usr/bin/nsenter") || !std::filesystem::exists(ip)) {
    GTEST_SKIP() << "needs root, /usr/bin/unshare, /usr/bin/nsenter and ip: runs the nodes in a "
                    "network namespace whose loopback starts down";
  }
  const auto node = [&](int rank, std::vector<std::string> prefix) {
    const std::vector<std::string> args = {
        xla_spawn_path(), "--nnodes", "2", "--node-rank", std::to_string(rank), "--master-addr",
        "127.0.0.1", "--master-port", std::to_string(port_), "--rdzv-timeout", "60", "-n", "1",
        "--", helper_path(), "--do", "print-env"};
    prefix.insert(prefix.end(), args.begin(), args.end());
    return std::make_unique<Launch>(prefix, true);
  };
  auto node1 = node(1, {"/usr/bin/unshare", "-n", "--"});
  ASSERT_NO_FATAL_FAILURE(wait_for_err(
      *node1, "node 1: no route to 127.0.0.1:" + std::to_string(port_) +
                  ": Network is unreachable (errno 101); trying again until the rendezvous "
                  "timeout (60 s)"));
  const std::string netns = fmt::format("--net=/proc/{}/ns/net", node1->pid());
  ASSERT_EQ(std::system(fmt::format("/usr/bin/nsenter {} -- {} link set lo up", netns, ip).c_str()), 0);
  auto node0 = node(0, {"/usr/bin/nsenter", netns, "--"});
  EXPECT_EQ(WEXITSTATUS(node1->wait_or_fail(scaled(seconds(30)))), 0) << node1->err();
  EXPECT_EQ(WEXITSTATUS(node0->wait_or_fail(scaled(seconds(30)))), 0) << node0->err();
  EXPECT_NE(node1->err().find("formed: 2 nodes"), std::string::npos) << node1->err();
  EXPECT_EQ(env_of(node1->out(), 1).at("MASTER_ADDR"), "127.0.0.1") << node1->out();
}

}  // namespace
}  // namespace xs::testing
