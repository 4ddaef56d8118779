// Failure paths with real processes: a SIGKILLed replica, a replica that stops calling,
// mismatched calls, segment cleanup, and two jobs side by side.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "xla_spawn/base/error.h"
#include "xla_spawn/shm/call_report.h"
#include "xla_spawn/shm/futex.h"
#include "xla_spawn/shm/wait.h"
#include "tests/collectives/fork_harness.h"
#include "tests/collectives/test_data.h"
#include "tests/support/scoped_env.h"

namespace xs::testing {
namespace {

constexpr size_t kStagingBytes = 64 << 10;

bool segment_exists(const std::string& name) {
  return std::filesystem::exists("/dev/shm" + name);
}

// Scratch layout for the kill test: [0] the victim's kill time, [1 + o] ordinal o's
// nanoseconds from that kill to its error.
std::atomic<int64_t>* scratch_words(std::byte* scratch) {
  return reinterpret_cast<std::atomic<int64_t>*>(scratch);
}

class KillTest : public ::testing::TestWithParam<std::tuple<int, AllReduceAlgorithm>> {};

TEST_P(KillTest, OthersNameTheKilledOrdinalWithinTwoSeconds) {
  const auto [world_size, algo] = GetParam();
  const int victim = world_size / 2;
  std::string name;
  std::vector<pid_t> pids;
  std::vector<int64_t> error_after_ns(world_size);
  JobResult result;
  {
    ForkJob job(world_size, kStagingBytes);
    name = job.segment_name();
    job.start([victim, algo = algo](Child& child) {
      ShmCommunicator comm = child.communicator({.algorithm = algo, .timeout_ms = 30'000});
      // kDirect runs on operands in the replicas' arenas (peers write into them in place).
      std::vector<float> heap(5000, 1.0f);
      float* data = heap.data();
      if (algo == AllReduceAlgorithm::kDirect) {
        data = static_cast<float*>(comm.alloc_buffer(heap.size() * sizeof(float)));
        std::copy(heap.begin(), heap.end(), data);
      }
      auto* words = scratch_words(child.scratch);
      for (int i = 0; i < 1'000'000; ++i) {
        if (child.ordinal == victim && i == 50) {
          words[0].store(monotonic_ns());
          ::kill(::getpid(), SIGKILL);
        }
        try {
          comm.all_reduce(data, heap.size(), DType::kF32, ReduceOp::kMean);
        } catch (const Error& e) {
          words[1 + child.ordinal].store(monotonic_ns() - words[0].load());
          return std::string(e.what());
        }
      }
      return std::string("no error after 1e6 all-reduces");
    });
    pids = job.pids();
    result = job.wait(std::chrono::seconds(60));
    for (int o = 0; o < world_size; ++o) error_after_ns[o] = scratch_words(job.scratch())[1 + o];
  }
  EXPECT_FALSE(segment_exists(name)) << name << " left behind";
  ASSERT_FALSE(result.timed_out) << result.describe();
  const std::string dead = fmt::format("ordinal {} (pid {})", victim, pids[victim]);
  for (const ChildResult& child : result.children) {
    if (child.ordinal == victim) {
      EXPECT_EQ(child.signal, SIGKILL) << result.describe();
      continue;
    }
    EXPECT_EQ(child.exit_code, 1) << result.describe();
    EXPECT_NE(child.message.find(dead), std::string::npos)
        << "ordinal " << child.ordinal << " did not name " << dead << ": " << child.message;
    EXPECT_LT(error_after_ns[child.ordinal], 2'000'000'000)
        << "ordinal " << child.ordinal << " took " << error_after_ns[child.ordinal] * 1e-9
        << " s to notice";
  }
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, KillTest,
    ::testing::Combine(::testing::Values(2, 4, 8),
                       ::testing::Values(AllReduceAlgorithm::kOneShot, AllReduceAlgorithm::kTwoShot,
                                         AllReduceAlgorithm::kRing, AllReduceAlgorithm::kCma,
                                         AllReduceAlgorithm::kDirect)),
    [](const auto& info) {
      return fmt::format("N{}_{}", std::get<0>(info.param),
                         all_reduce_algorithm_name(std::get<1>(info.param)));
    });

class StopTest : public ::testing::TestWithParam<int> {};

TEST_P(StopTest, AReplicaThatStopsCallingMakesTheOthersTimeOutNamingIt) {
  const int world_size = GetParam();
  const int quitter = world_size - 1;
  // The timeout also bounds the warm-up's first call, which waits for the last child forked.
  ScopedEnv timeout("XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", "2000");
  ForkJob job(world_size, kStagingBytes);
  job.start([quitter](Child& child) {
    ShmCommunicator comm = child.communicator();
    std::vector<int64_t> data(100, child.ordinal);
    for (int i = 0; i < 10; ++i) comm.all_reduce(data.data(), 100, DType::kI64, ReduceOp::kSum);
    if (child.ordinal == quitter) {
      // Alive but silent: wait (bounded) until the others have given up on us.
      const int64_t give_up = monotonic_ns() + 30'000'000'000;
      while (!comm.segment().poison_message() && monotonic_ns() < give_up) ::usleep(1000);
      return comm.segment().poison_message() ? std::string() : "segment never poisoned";
    }
    try {
      comm.all_reduce(data.data(), 100, DType::kI64, ReduceOp::kSum);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_FALSE(result.timed_out) << result.describe();
  const std::string missing = fmt::format("ordinal {} (pid {})", quitter, job.pids()[quitter]);
  for (const ChildResult& child : result.children) {
    if (child.ordinal == quitter) {
      EXPECT_TRUE(child.ok()) << result.describe();
      continue;
    }
    EXPECT_NE(child.message.find("timed out"), std::string::npos) << result.describe();
    EXPECT_NE(child.message.find(missing), std::string::npos) << result.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, StopTest, ::testing::Values(2, 5));

// The replica that arrives after its peer timed out on it must not complete the call on the
// round its peer posted before poisoning the segment: it fails too, naming the poison.
TEST(StopTest, AReplicaArrivingAfterItsPeerGaveUpFailsInsteadOfCompleting) {
  ScopedEnv timeout("XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", "300");
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    ShmCommunicator comm = child.communicator();
    comm.barrier();
    if (child.ordinal == 1) {
      const int64_t give_up = monotonic_ns() + 30'000'000'000;
      while (!comm.segment().poison_message() && monotonic_ns() < give_up) ::usleep(1000);
    }
    try {
      comm.barrier();
    } catch (const PeerFailure& e) {
      return std::string(e.what());
    }
    return std::string("completed");
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_FALSE(result.timed_out) << result.describe();
  EXPECT_NE(result.children[0].message.find("timed out"), std::string::npos) << result.describe();
  EXPECT_NE(result.children[1].message.find("barrier on ordinal 1: segment poisoned by ordinal 0"),
            std::string::npos)
      << result.describe();
}

// Ordinal 1 is stopped inside a barrier it has posted; ordinal 0 completes the barrier, then
// gives the job up (as a Ctrl-C'ed Python replica does, which may then change the operand a
// peer is still reading). Ordinal 1, continued, sees the round complete, but its call must
// fail rather than return a result read while the job was failing.
TEST(StopTest, ACallThatCompletesAfterAPeerGaveUpFailsAsItReturns) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    ShmCommunicator comm = child.communicator();
    auto* pids = reinterpret_cast<std::atomic<pid_t>*>(child.scratch);
    pids[child.ordinal].store(::getpid());
    comm.barrier();
    if (child.ordinal == 1) {
      try {
        comm.barrier();
      } catch (const PeerFailure& e) {
        return std::string(e.what());
      }
      return std::string("completed");
    }
    // Ordinal 1 sleeps inside barrier #2, waiting for this one: it has posted its arrival.
    namespace bip = boost::interprocess;
    bip::shared_memory_object shm(bip::open_only, child.segment_name.c_str(), bip::read_only);
    bip::mapped_region region(shm, bip::read_only);
    const auto waits_inside = [&] {
      const OrdinalCall one = read_calls(region.get_address(), region.get_size(), 2, {})[1];
      return one.seq == 2 && !one.returned && one.seconds_waiting >= 0;
    };
    const int64_t deadline = monotonic_ns() + 20'000'000'000;
    while (!waits_inside() && monotonic_ns() < deadline) ::usleep(1000);
    if (!waits_inside()) return std::string("ordinal 1 never waited inside barrier #2");
    const pid_t peer = pids[1].load();
    ::kill(peer, SIGSTOP);
    for (int i = 0; i < 10000 && process_stat_fields(peer).value_or("T")[0] != 'T'; ++i) ::usleep(1000);
    if (process_stat_fields(peer).value_or("T")[0] != 'T') return std::string("ordinal 1 never stopped");
    comm.barrier();  // completes: ordinal 1 posted before it stopped
    comm.segment().poison("ordinal 0 gave the job up");
    ::kill(peer, SIGCONT);
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_FALSE(result.timed_out) << result.describe();
  EXPECT_NE(result.children[1].message.find("barrier on ordinal 1: segment poisoned by ordinal 0: "
                                            "ordinal 0 gave the job up (this call's result is not "
                                            "used)"),
            std::string::npos)
      << result.describe();
}

TEST(MismatchTest, DifferentElementCountsAreReportedWithBothSides) {
  ForkJob job(3, kStagingBytes);
  job.start([](Child& child) {
    ShmCommunicator comm = child.communicator();
    const size_t n = child.ordinal == 2 ? 4096 : 4095;
    std::vector<float> data(n, 1.0f);
    try {
      comm.all_reduce(data.data(), n, DType::kF32, ReduceOp::kSum);
      return std::string("no error");
    } catch (const PeerFailure& e) {
      const std::string what = e.what();
      if (what.find("4096 elements") == std::string::npos ||
          what.find("4095 elements") == std::string::npos) {
        return "message lacks both counts: " + what;
      }
    }
    // Every ordinal saw the mismatch in the same round, so the communicator still works.
    std::vector<float> ok(10, 1.0f);
    comm.all_reduce(ok.data(), 10, DType::kF32, ReduceOp::kSum);
    return ok[0] == 3.0f ? std::string() : fmt::format("after mismatch: {} != 3", ok[0]);
  });
  const JobResult result = job.wait(std::chrono::seconds(30));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

TEST(MismatchTest, DifferentDTypesAndKindsAreReported) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    ShmCommunicator comm = child.communicator();
    std::vector<int64_t> data(16, 1);
    std::string errors;
    try {
      comm.all_reduce(data.data(), 16, child.ordinal == 0 ? DType::kI64 : DType::kF64,
                      ReduceOp::kSum);
    } catch (const PeerFailure& e) {
      errors += e.what();
    }
    try {
      if (child.ordinal == 0) {
        comm.barrier();
      } else {
        comm.broadcast(data.data(), 16, DType::kI64, 0);
      }
    } catch (const PeerFailure& e) {
      errors += e.what();
    }
    for (const char* needle : {"of i64", "of f64", "barrier", "broadcast"}) {
      if (errors.find(needle) == std::string::npos)
        return fmt::format("no '{}' in: {}", needle, errors);
    }
    // A barrier moves nothing: it used to be named "barrier #2 with 0 elements of f32".
    if (errors.find("called barrier #2") == std::string::npos ||
        errors.find("barrier #2 with") != std::string::npos) {
      return fmt::format("the barrier is not named plainly in: {}", errors);
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(30));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// A child forked by a replica shares its parent's mailboxes. Its collective is refused before
// it touches them, so the parents' next call still sums their own values: before, the child
// took its parent's turn and the replicas silently reduced different rounds.
TEST(ForkTest, AForkedChildsCollectiveIsRefusedAndTheParentsStayCorrect) {
  ForkJob job(3, kStagingBytes);
  job.start([](Child& child) {
    ShmCommunicator comm = child.communicator();
    comm.barrier();
    const pid_t pid = ::fork();
    if (pid == 0) {
      float one[4] = {1, 1, 1, 1};
      int code = 3;
      try {
        comm.all_reduce(one, 4, DType::kF32, ReduceOp::kSum);
        code = 1;
      } catch (const InvalidArgument& e) {
        code = std::string(e.what()).find("forked") != std::string::npos ? 0 : 2;
      } catch (...) {
      }
      ::_exit(code);
    }
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return fmt::format("the forked child's all_reduce was not refused (status {:#x})", status);
    }
    std::vector<float> data(4, static_cast<float>(child.ordinal + 1));
    comm.all_reduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum);
    return data[0] == 6.0f && data[3] == 6.0f ? std::string()
                                              : fmt::format("parent's sum {} != 6", data[0]);
  });
  const JobResult result = job.wait(std::chrono::seconds(30));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// A replica whose communicator ended (shutdown() in Python) while its process runs on: a peer
// waiting for it fails as soon as its liveness check sees the slot marked left, naming it,
// instead of waiting out the collective timeout.
TEST(StopTest, APeerWhoseCommunicatorEndedFailsTheWaiterAtOnce) {
  ScopedEnv timeout("XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", "30000");
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    std::optional<ShmCommunicator> comm;
    comm.emplace(child.attach());
    comm->barrier();
    if (child.ordinal == 0) {
      comm.reset();
      ::sleep(4);  // alive, but out of the job
      return std::string();
    }
    const auto start = std::chrono::steady_clock::now();
    float data[4] = {1, 1, 1, 1};
    try {
      comm->all_reduce(data, 4, DType::kF32, ReduceOp::kSum);
      return std::string("all_reduce returned");
    } catch (const PeerFailure& e) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (std::string(e.what()).find("ordinal 0") == std::string::npos ||
          std::string(e.what()).find("has left the job") == std::string::npos || waited > 2.0) {
        return fmt::format("after {:.2f} s: {}", waited, e.what());
      }
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// The waiter reads the peer's word, is preempted, and meanwhile the peer posts what it waits
// for and leaves (its last collective done, its communicator ended: a normal job end). The
// liveness check then sees the slot left, but the wait must return, not fail the job.
TEST(StopTest, APeerThatPostedAndThenLeftDoesNotFailTheWait) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    auto* word = reinterpret_cast<std::atomic<uint32_t>*>(child.scratch);
    if (child.ordinal == 1) {
      std::optional<Segment> segment(child.attach());
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
      word->store(1);
      futex_wake_all(word);
      segment.reset();  // marks the slot left
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      return std::string();
    }
    Segment segment = child.attach();
    Waiter waiter(segment, 10'000);
    const auto start = std::chrono::steady_clock::now();
    bool preempted = false;
    try {
      waiter.wait("test wait", [&]() -> Awaited {
        const uint32_t seen = word->load();
        // Once, past the first liveness check's time: stalled right after reading the word.
        if (!preempted && std::chrono::steady_clock::now() - start > std::chrono::milliseconds(45)) {
          preempted = true;
          std::this_thread::sleep_for(std::chrono::milliseconds(30));
        }
        return seen == 1 ? Awaited{} : Awaited{word, 1};
      });
    } catch (const Error& e) {
      return fmt::format("the wait failed though ordinal 1 had posted: {}", e.what());
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(30));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// The arrival counts each ordinal keeps in its slot: before every call, ordinal 1 waits until
// the others' call records show them inside it and then 2 ms more, so it is the last to
// arrive at each one by at least that, whatever the scheduler does.
TEST(ArrivalCountsTest, TheOrdinalThatComesLateIsCountedLastWithItsLateness) {
  constexpr int kCalls = 30;
  ForkJob job(3, kStagingBytes);
  job.start([](Child& child) {
    namespace bip = boost::interprocess;
    bip::shared_memory_object shm(bip::open_only, child.segment_name.c_str(), bip::read_only);
    bip::mapped_region region(shm, bip::read_only);
    // Until ordinals 0 and 2 have begun call number `seq` (their records' seq is stored after
    // their arrival time), for at most 20 s.
    const auto until_the_others_began = [&](uint64_t seq) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (std::chrono::steady_clock::now() < deadline) {
        const auto calls = read_calls(region.get_address(), region.get_size(), 3, {});
        if (calls.size() == 3 && calls[0].seq >= seq && calls[2].seq >= seq) return true;
        ::usleep(500);
      }
      return false;
    };
    ShmCommunicator comm = child.communicator();
    float value = 1;
    comm.barrier();  // the children start at different times: anyone may be last here
    for (int i = 0; i < kCalls; ++i) {
      if (child.ordinal == 1) {
        if (!until_the_others_began(i + 2u)) return fmt::format("call {}: the others never came", i);
        ::usleep(2'000);
      }
      if (i % 2 == 0) comm.barrier();
      else comm.all_reduce(&value, 1, DType::kF32, ReduceOp::kSum);
    }
    return std::string();
  });
  const auto result = job.wait(std::chrono::seconds(60));
  ASSERT_TRUE(result.all_ok()) << result.describe();
  namespace bip = boost::interprocess;
  bip::shared_memory_object shm(bip::open_only, job.segment_name().c_str(), bip::read_only);
  bip::mapped_region region(shm, bip::read_only);
  const std::vector<OrdinalCall> calls =
      read_calls(region.get_address(), region.get_size(), 3, {});
  ASSERT_EQ(calls.size(), 3u);
  for (const OrdinalCall& c : calls) {
    EXPECT_EQ(c.other.calls, kCalls + 1u) << c.ordinal;
    EXPECT_GE(c.other.waited, uint64_t{kCalls}) << c.ordinal;
    EXPECT_EQ(c.steps.calls, 0u) << c.ordinal;  // no runtime program made them
  }
  // The first barrier's last arrival is anyone's.
  EXPECT_GE(calls[1].other.last, uint64_t{kCalls});
  EXPECT_GE(calls[1].other.late_us, uint64_t{kCalls} * 2'000);
  EXPECT_LE(calls[0].other.last + calls[2].other.last, 1u);
  const auto line = straggler_line(calls, 0);
  ASSERT_TRUE(line.has_value());
  EXPECT_TRUE(line->starts_with("ordinal 1 arrived last at ")) << *line;
  EXPECT_NE(line->find(" collective calls that waited"), std::string::npos) << *line;
}

// The hang report's records tell a replica inside a call from one that has returned from
// its latest: ordinal 0 waits in the second barrier while ordinal 1, back from the first,
// looks at both records before it comes.
TEST(CallRecordTest, ACallThatReturnedIsMarkedSoAndTheNextClearsIt) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    namespace bip = boost::interprocess;
    bip::shared_memory_object shm(bip::open_only, child.segment_name.c_str(), bip::read_only);
    bip::mapped_region region(shm, bip::read_only);
    const auto records = [&] {
      return read_calls(region.get_address(), region.get_size(), 2, {});
    };
    ShmCommunicator comm = child.communicator();
    comm.barrier();
    if (child.ordinal == 1) {
      if (!records()[1].returned) return std::string("back from barrier #1 but not marked so");
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (records()[0].seq < 2 && std::chrono::steady_clock::now() < deadline) ::usleep(500);
      const OrdinalCall zero = records()[0];
      if (zero.seq != 2 || zero.returned) {
        return fmt::format("ordinal 0 should be inside barrier #2: seq {}, returned {}", zero.seq,
                           zero.returned);
      }
    }
    comm.barrier();
    const OrdinalCall mine = records()[static_cast<size_t>(child.ordinal)];
    return mine.seq == 2 && mine.returned ? std::string() : std::string("#2 not marked returned");
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

TEST(JobIsolationTest, TwoJobsAtOnceDoNotSeeEachOther) {
  ForkJob first(3, kStagingBytes);
  ForkJob second(2, kStagingBytes);
  auto body = [](int scale) {
    return [scale](Child& child) {
      ShmCommunicator comm = child.communicator();
      for (int i = 0; i < 200; ++i) {
        std::vector<int32_t> data(3000, scale * (child.ordinal + 1));
        comm.all_reduce(data.data(), data.size(), DType::kI32, ReduceOp::kSum);
        const int32_t want = scale * child.world_size * (child.world_size + 1) / 2;
        if (data[2999] != want) return fmt::format("iteration {}: {} != {}", i, data[2999], want);
      }
      return std::string();
    };
  };
  first.start(body(1));
  second.start(body(1000));
  const JobResult a = first.wait(std::chrono::seconds(60));
  const JobResult b = second.wait(std::chrono::seconds(60));
  EXPECT_TRUE(a.all_ok()) << a.describe();
  EXPECT_TRUE(b.all_ok()) << b.describe();
  EXPECT_NE(first.segment_name(), second.segment_name());
  EXPECT_THROW(Segment::attach(first.segment_name(), 0, 3, second.job_id()), InvalidArgument);
}

TEST(SegmentCleanupTest, SegmentIsGoneAfterJobsThatSucceedOrFail) {
  std::string ok_name, failed_name;
  {
    ForkJob job(2, kStagingBytes);
    ok_name = job.segment_name();
    job.start([](Child& child) {
      child.communicator().barrier();
      return std::string();
    });
    EXPECT_TRUE(job.wait(std::chrono::seconds(30)).all_ok());
    EXPECT_TRUE(segment_exists(ok_name));
  }
  {
    ForkJob job(2, kStagingBytes);
    failed_name = job.segment_name();
    job.start([](Child&) -> std::string { throw std::runtime_error("replica failed"); });
    EXPECT_FALSE(job.wait(std::chrono::seconds(30)).all_ok());
  }
  EXPECT_FALSE(segment_exists(ok_name));
  EXPECT_FALSE(segment_exists(failed_name));
}

}  // namespace
}  // namespace xs::testing
