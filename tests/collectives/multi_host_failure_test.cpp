// Failure paths of a multi-node job. A replica SIGKILLed in the middle of a loop of
// all-reduces: every other replica, on its node and on the others, fails with
// xs::PeerFailure or xs::Timeout naming the call, within a bound far below the timeout, and
// refuses later calls. A replica that stops calling: the others time out. Replicas waiting
// for a late node show so in their hang report records. Bad arguments are rejected where they
// enter, naming the values.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <vector>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <fmt/format.h>

#include <gloo/rendezvous/hash_store.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/shm/call_report.h"
#include "tests/collectives/multi_host_harness.h"
#include "tests/support/deadline_scale.h"

namespace xs::testing {
namespace {

constexpr int64_t kTimeoutMs = 5'000;
// Peers learn of the death from closed connections and poisoned segments, not timeouts.
constexpr int64_t kNoticeWithinNs = 2'000'000'000;

// Scratch layout: [0] the victim's kill time, [1 + o] ordinal o's nanoseconds from the kill
// to its error.
std::atomic<int64_t>* scratch_words(std::byte* scratch) {
  return reinterpret_cast<std::atomic<int64_t>*>(scratch);
}

// "Timeout: <what>" or "PeerFailure: <what>" (anything else: the type is wrong).
std::string describe_failure(const Error& e) {
  if (dynamic_cast<const Timeout*>(&e) != nullptr) return "Timeout: " + std::string(e.what());
  if (dynamic_cast<const PeerFailure*>(&e) != nullptr)
    return "PeerFailure: " + std::string(e.what());
  return "unexpected error type: " + std::string(e.what());
}

// After a failure the communicator refuses every call, naming the first failure; "" if so.
std::string still_broken(MultiHostCommunicator& comm) {
  try {
    comm.barrier();
  } catch (const PeerFailure& e) {
    if (std::string(e.what()).find("unusable after an earlier failure") != std::string::npos)
      return "";
    return std::string(" | barrier after the failure: ") + e.what();
  }
  return " | barrier after the failure succeeded";
}

bool typed_failure(const std::string& message) {
  return message.starts_with("PeerFailure: ") || message.starts_with("Timeout: ");
}

// SIGKILLs node 1's last replica in the middle of a loop of `call`s ("all_reduce",
// "reduce_scatter" or "all_gather") of n_elems floats per ordinal: every other replica fails
// with a typed error naming the call, within the bound.
void expect_clean_failures(const std::vector<int>& sizes, size_t n_elems,
                           const std::string& call = "all_reduce") {
  const NodeTopology shape(sizes, 0, 0);
  const int victim = shape.first_ordinal(1) + shape.node_size(1) - 1;  // node 1's last replica
  // Stretched under sanitizers: six instrumented processes connecting their gloo groups on a
  // loaded machine once took longer than 5 s, before the victim was even killed.
  const int64_t timeout_ms = kTimeoutMs * deadline_scale();
  MultiHostJob job(sizes, {.timeout_ms = timeout_ms, .prefix = {}});
  job.start([victim, n_elems, call](Child& child, MultiHostCommunicator& comm) {
    const auto w = static_cast<size_t>(child.world_size);
    std::vector<float> data(call == "all_reduce" ? n_elems : w * n_elems, 1.0f);
    std::vector<float> mine(n_elems, 1.0f);
    auto* words = scratch_words(child.scratch);
    for (int i = 0; i < 1'000'000; ++i) {
      if (child.ordinal == victim && i == 50) {
        words[0].store(monotonic_ns());
        ::kill(::getpid(), SIGKILL);
      }
      try {
        if (call == "reduce_scatter") {
          comm.reduce_scatter(data.data(), mine.data(), n_elems, DType::kF32, ReduceOp::kMean);
        } else if (call == "all_gather") {
          comm.all_gather(mine.data(), data.data(), n_elems, DType::kF32);
        } else {
          comm.all_reduce(data.data(), data.size(), DType::kF32, ReduceOp::kMean);
        }
      } catch (const Error& e) {
        words[1 + child.ordinal].store(monotonic_ns() - words[0].load());
        return describe_failure(e) + still_broken(comm);
      }
    }
    return std::string("no error after 1e6 all-reduces");
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_FALSE(result.timed_out) << result.describe();
  for (const ChildResult& child : result.children) {
    if (child.ordinal == victim) {
      EXPECT_EQ(child.signal, SIGKILL) << result.describe();
      continue;
    }
    EXPECT_EQ(child.exit_code, 1) << result.describe();
    EXPECT_TRUE(typed_failure(child.message)) << result.describe();
    EXPECT_EQ(child.message.find(" | "), std::string::npos) << result.describe();
    EXPECT_NE(child.message.find(call + " (f32, "), std::string::npos) << result.describe();
    const int64_t after_ns = scratch_words(job.fork_job().scratch())[1 + child.ordinal];
    EXPECT_LT(after_ns, kNoticeWithinNs * deadline_scale())
        << "ordinal " << child.ordinal << " took " << after_ns * 1e-9 << " s: " << child.message;
  }
}

class MultiHostKillTest : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(MultiHostKillTest, EveryOtherReplicaFailsCleanlyWithinABound) {
  expect_clean_failures(GetParam(), 5000);
}

// 12 MiB: a peer killed while megabytes are in flight must still fail every other replica
// cleanly, none left waiting.
TEST_P(MultiHostKillTest, EveryOtherReplicaFailsCleanlyInALargeAllReduce) {
  expect_clean_failures(GetParam(), 3 << 20);
}

// The sharded update's collectives, whose network phases are batches of point-to-point
// transfers: 4 MiB per ordinal, chunks in flight from several peers when the victim dies.
TEST_P(MultiHostKillTest, EveryOtherReplicaFailsCleanlyInALargeReduceScatter) {
  expect_clean_failures(GetParam(), 1 << 20, "reduce_scatter");
}

TEST_P(MultiHostKillTest, EveryOtherReplicaFailsCleanlyInALargeAllGather) {
  expect_clean_failures(GetParam(), 1 << 20, "all_gather");
}

INSTANTIATE_TEST_SUITE_P(Topologies, MultiHostKillTest,
                         ::testing::Values(std::vector<int>{2, 2}, std::vector<int>{1, 2, 1},
                                           std::vector<int>{3, 1, 2}),
                         [](const auto& info) {
                           return fmt::format("Nodes{}", fmt::join(info.param, "_"));
                         });


// The quitter stays alive (its sockets open) until the others have given up, so they can only
// learn of it by their timeout.
TEST(MultiHostStopTest, AReplicaThatStopsCallingMakesTheOthersTimeOut) {
  MultiHostJob job({1, 1}, {.timeout_ms = 2000, .prefix = {}});  // set-up and warm-up too
  job.start([](Child& child, MultiHostCommunicator& comm) -> std::string {
    auto* given_up = scratch_words(child.scratch);
    std::vector<int64_t> data(100, child.ordinal);
    for (int i = 0; i < 10; ++i) comm.all_reduce(data.data(), 100, DType::kI64, ReduceOp::kSum);
    if (child.ordinal == 1) {
      const int64_t deadline = monotonic_ns() + 30'000'000'000;
      while (given_up->load() == 0 && monotonic_ns() < deadline) ::usleep(1000);
      return given_up->load() != 0 ? "" : "the others never gave up";
    }
    const int64_t start = monotonic_ns();
    try {
      comm.all_reduce(data.data(), 100, DType::kI64, ReduceOp::kSum);
      given_up->store(1);
      return "no error";
    } catch (const Error& e) {
      given_up->store(1);
      const double waited_s = (monotonic_ns() - start) * 1e-9;
      if (waited_s > 5.0 * deadline_scale()) return fmt::format("gave up after {:.1f} s", waited_s);
      return describe_failure(e);
    }
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_FALSE(result.timed_out) << result.describe();
  EXPECT_TRUE(result.children[1].ok()) << result.describe();
  const std::string& message = result.children[0].message;
  EXPECT_TRUE(message.starts_with("Timeout: ")) << result.describe();
  EXPECT_NE(message.find("all_reduce (i64, 100 elements) across nodes 0-1 (ordinals 0, 1)"),
            std::string::npos)
      << result.describe();
}

// Node 1's replica comes late to an all-reduce: node 0's two replicas, done with its local
// reduce, wait in its network phase, and their records (what the launcher's hang report
// reads) say so instead of "between collective calls"; the mark goes when the call returns.
TEST(MultiHostCallRecordTest, ReplicasWaitingForALateNodeAreShownBetweenNodes) {
  MultiHostJob job({2, 1});
  const std::string node0 = job.segment_name(0);
  job.start([&node0](Child& child, MultiHostCommunicator& comm) -> std::string {
    namespace bip = boost::interprocess;
    bip::shared_memory_object shm(bip::open_only, node0.c_str(), bip::read_only);
    bip::mapped_region region(shm, bip::read_only);
    const auto node0_calls = [&] {
      return read_calls(region.get_address(), region.get_size(), 2, {});
    };
    std::vector<float> data(size_t{1} << 16, 1.0f);
    comm.barrier();  // the groups' connections are made
    std::string seen;  // what ordinal 2 found wrong; it joins the call in any case
    if (child.ordinal == 2) {
      const auto both_between_nodes = [&] {
        const std::vector<OrdinalCall> calls = node0_calls();
        return calls.size() == 2 && calls[0].between_nodes && calls[1].between_nodes &&
               calls[0].name == "all_reduce" && calls[1].name == "all_reduce";
      };
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!both_between_nodes() && std::chrono::steady_clock::now() < deadline) ::usleep(1000);
      const std::string report = format_calls(node0_calls(), 0);
      if (!both_between_nodes()) seen = "node 0 never shown between nodes:\n" + report;
      for (const char* want : {"ordinal 0 (pid ", "ordinal 1 (pid "}) {
        const size_t line = report.find(want);
        const size_t text = report.find(
            "all_reduce (f32, 65536 elements) between nodes for ", line);
        if (line == std::string::npos || text == std::string::npos ||
            report.find(", waiting for the other nodes", text) == std::string::npos) {
          seen = "unexpected report:\n" + report;
        }
      }
      if (report.find("held up by") != std::string::npos) seen = "blames node 0:\n" + report;
    }
    comm.all_reduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum);
    if (!seen.empty()) return seen;
    if (data.front() != 3 || data.back() != 3) return fmt::format("sum {}", data.front());
    if (child.ordinal < 2 && node0_calls()[static_cast<size_t>(child.ordinal)].between_nodes) {
      return "still marked between nodes after the call";
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

TEST(MultiHostArgumentTest, BadTopologiesAndLocalCommunicatorsAreRejectedNamingValues) {
  auto message = [](NodeTopology topology, std::shared_ptr<gloo::rendezvous::Store> store,
                    const std::string& address) -> std::string {
    try {
      MultiHostCommunicator comm(std::move(topology), nullptr, std::move(store), address);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no error";
  };
  const auto store = std::make_shared<gloo::rendezvous::HashStore>();
  EXPECT_NE(message(NodeTopology({2, 2}, 1, 0), store, "127.0.0.1")
                .find("node 1 runs 2 replicas but got no local communicator"),
            std::string::npos);
  EXPECT_NE(message(NodeTopology({1, 2}, 0, 0), nullptr, "127.0.0.1").find("no rendezvous store"),
            std::string::npos);
  EXPECT_NE(message(NodeTopology({1, 2}, 0, 0), store, "").find("empty address for node 0"),
            std::string::npos);
}

// Rejected before anything is sent, on every replica alike: the communicator stays usable.
TEST(MultiHostArgumentTest, BadCallArgumentsAreRejectedWhereTheyEnter) {
  MultiHostJob job({1, 2});
  job.start([](Child&, MultiHostCommunicator& comm) -> std::string {
    std::vector<float> data(8, 1.0f);
    std::string errors;
    auto expect_invalid = [&](const std::function<void()>& call, const std::string& needle) {
      try {
        call();
        errors += "no error for '" + needle + "'; ";
      } catch (const InvalidArgument& e) {
        if (std::string(e.what()).find(needle) == std::string::npos) errors += e.what();
      }
    };
    expect_invalid([&] { comm.broadcast(data.data(), 8, DType::kF32, 3); },
                   "broadcast: root 3 outside 0..2");
    expect_invalid([&] { comm.broadcast(data.data(), 8, DType::kF32, -1); }, "root -1");
    expect_invalid([&] { comm.all_reduce(nullptr, 8, DType::kF32, ReduceOp::kSum); },
                   "all_reduce: null buffer for 8 elements");
    expect_invalid([&] { comm.all_reduce(data.data(), 8, DType::kBool, ReduceOp::kSum); },
                   "all_reduce");
    expect_invalid([&] { comm.all_gather(data.data(), data.data(), size_t{1} << 62, DType::kF64); },
                   "overflow");
    comm.all_reduce(data.data(), 8, DType::kF32, ReduceOp::kSum);
    if (data[7] != 3.0f) errors += fmt::format("after the rejections: {} != 3", data[7]);
    return errors;
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

}  // namespace
}  // namespace xs::testing
