// A careless program's misuse of the communicator is refused with a clear error on every
// replica, never a crash or a silently wrong result: null operands, counts whose bytes
// overflow, dtype and op codes outside their enums, an arena request past any size, two threads calling at once, replicas forcing
// different all-reduce schedules.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/local_communicator.h"
#include "xla_spawn/shm/call_report.h"
#include "tests/collectives/fork_harness.h"

namespace xs {
namespace {

using testing::Child;
using testing::ForkJob;
using testing::JobResult;

constexpr size_t kStagingBytes = 64 << 10;
constexpr size_t kHuge = (size_t{1} << 62) + 4;  // times 4 bytes wraps to 16

// Runs `call` and returns what it threw as InvalidArgument, or a description of what else
// happened.
template <typename F>
std::string refusal(F call) {
  try {
    call();
    return "returned";
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("threw another error: ") + e.what();
  }
}

// Each check: the message the refusal must carry, else a line for the test's failure.
std::string expect_refused(const std::string& what, const std::string& got,
                           const std::string& says) {
  return got.find(says) == std::string::npos ? fmt::format("{}: {}\n", what, got) : "";
}

std::string misuse_checks(Communicator& comm) {
  float f[4] = {};
  std::vector<float> out(4 * static_cast<size_t>(comm.world_size()));
  std::string failures;
  failures += expect_refused(
      "reduce_scatter null in",
      refusal([&] { comm.reduce_scatter(nullptr, f, 4, DType::kF32, ReduceOp::kSum); }),
      "reduce_scatter: null buffer for");
  failures += expect_refused(
      "reduce_scatter null out",
      refusal([&] { comm.reduce_scatter(out.data(), nullptr, 4, DType::kF32, ReduceOp::kSum); }),
      "reduce_scatter: null buffer for");
  failures += expect_refused(
      "all_gather null in", refusal([&] { comm.all_gather(nullptr, out.data(), 4, DType::kF32); }),
      "all_gather: null buffer for");
  failures += expect_refused(
      "all_gather null out", refusal([&] { comm.all_gather(f, nullptr, 4, DType::kF32); }),
      "all_gather: null buffer for");
  failures += expect_refused(
      "all_reduce huge",
      refusal([&] { comm.all_reduce(f, kHuge, DType::kF32, ReduceOp::kSum); }),
      "overflow a byte count");
  failures += expect_refused(
      "broadcast huge", refusal([&] { comm.broadcast(f, kHuge, DType::kF32, 0); }),
      "overflow a byte count");
  failures += expect_refused(
      "all_gather huge", refusal([&] { comm.all_gather(f, out.data(), kHuge, DType::kF32); }),
      "overflow a byte count");
  failures += expect_refused(
      "reduce_scatter huge",
      refusal([&] { comm.reduce_scatter(out.data(), f, kHuge, DType::kF32, ReduceOp::kSum); }),
      "overflow a byte count");
  // Codes outside the enums, as a careless cast from an integer makes them (dtype_size of
  // one is 0: the byte-count check divided by it).
  const auto bad_dtype = static_cast<DType>(kNumDTypes + 11);
  const auto bad_op = static_cast<ReduceOp>(kNumReduceOps + 5);
  failures += expect_refused(
      "all_reduce bad dtype",
      refusal([&] { comm.all_reduce(f, 4, bad_dtype, ReduceOp::kSum); }),
      "all_reduce: dtype code 17 is not a dtype");
  failures += expect_refused(
      "all_reduce bad op", refusal([&] { comm.all_reduce(f, 4, DType::kF32, bad_op); }),
      "all_reduce: reduce op code 9 is not a reduce op");
  failures += expect_refused(
      "reduce_scatter bad op",
      refusal([&] { comm.reduce_scatter(out.data(), f, 4, DType::kF32, bad_op); }),
      "reduce_scatter: reduce op code 9 is not a reduce op");
  failures += expect_refused(
      "broadcast bad dtype", refusal([&] { comm.broadcast(f, 4, bad_dtype, 0); }),
      "broadcast: dtype code 17 is not a dtype");
  failures += expect_refused(
      "all_gather bad dtype",
      refusal([&] { comm.all_gather(f, out.data(), 4, bad_dtype); }),
      "all_gather: dtype code 17 is not a dtype");
  const GatherPiece piece{0, sizeof f, f};
  failures += expect_refused(
      "all_gather_pieces bad dtype",
      refusal([&] { comm.all_gather_pieces(f, std::span(&piece, 1), 1, bad_dtype); }),
      "all_gather: dtype code 17 is not a dtype");
  // The job goes on: nothing reached the segment.
  float one = 1;
  comm.all_reduce(&one, 1, DType::kF32, ReduceOp::kSum);
  if (one != static_cast<float>(comm.world_size())) failures += fmt::format("sum {}\n", one);
  return failures;
}

// `checks` (what went wrong, or "") on every replica of a 2-replica job whose arena holds
// `arena_bytes`, then on a LocalCommunicator.
void expect_everywhere(std::string (*checks)(Communicator&),
                       size_t arena_bytes = kDefaultArenaBytes) {
  ForkJob job(2, kStagingBytes, arena_bytes);
  job.start([checks](Child& child) {
    ShmCommunicator comm = child.communicator();
    return checks(comm);
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
  LocalCommunicator alone;
  EXPECT_EQ(checks(alone), "");
}

TEST(MisuseTest, NullOperandsOverflowingCountsAndBadCodesAreRefusedAndTheJobGoesOn) {
  expect_everywhere(misuse_checks);
}

// A request past any arena size used to round up to 0 bytes and "fit" anywhere, returning a
// live block's address (and the heap's aligned new wrapped the same way).
TEST(MisuseTest, AnAllocationPastAnySizeIsBadAllocNotAnotherBlocksAddress) {
  ForkJob job(2, kStagingBytes, /*arena_bytes=*/1 << 20);
  job.start([](Child& child) -> std::string {
    ShmCommunicator comm = child.communicator();
    void* block = comm.alloc_buffer(4096);
    for (size_t bytes : {std::numeric_limits<size_t>::max() - 100,
                         std::numeric_limits<size_t>::max() - 4095}) {
      try {
        void* p = comm.alloc_buffer(bytes);
        return fmt::format("alloc_buffer({}) returned {} (a block is at {})", bytes, p, block);
      } catch (const std::bad_alloc&) {
      }
    }
    void* next = comm.alloc_buffer(4096);
    if (next == block) return "the arena handed out a live block again";
    comm.free_buffer(next);
    comm.free_buffer(block);
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// free_buffer of what alloc_buffer did not return, or returned and took back: an arena block
// was refused, but a block from the heap (the arena full, or of size 0) was handed to the
// aligned delete, which aborted (a stack pointer, a second free) or corrupted the heap (a
// pointer from new) silently.
std::string bad_frees(Communicator& comm) {
  float on_stack[4] = {};
  auto* from_new = new float[4];
  void* heap_block = comm.alloc_buffer(2 << 20);  // past the 1 MiB arena: the heap
  void* arena_block = comm.alloc_buffer(4096);
  comm.free_buffer(heap_block);
  comm.free_buffer(arena_block);
  std::string wrong;
  for (void* p : {static_cast<void*>(on_stack), static_cast<void*>(from_new), heap_block,
                  arena_block}) {
    try {
      comm.free_buffer(p);
      wrong += fmt::format("free_buffer({}) was taken; ", p);
    } catch (const InvalidArgument&) {
    }
  }
  delete[] from_new;
  comm.free_buffer(nullptr);  // nothing, as free(nullptr)
  return wrong;
}

TEST(MisuseTest, FreeingWhatAllocBufferDidNotGiveIsRefusedWhateverTheBlock) {
  expect_everywhere(bad_frees, /*arena_bytes=*/1 << 20);
}

// Two threads of one replica calling at once would pair up with the peers' calls in any
// order: the second is refused while the first is inside its call.
TEST(MisuseTest, ASecondThreadsCallDuringAnotherIsRefused) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) -> std::string {
    ShmCommunicator comm = child.communicator();
    auto* tried = reinterpret_cast<std::atomic<int>*>(child.scratch);  // ordinal 0's second call
    const auto wait_for = [](const std::function<bool()>& condition) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!condition() && std::chrono::steady_clock::now() < deadline) ::usleep(1000);
      return condition();
    };
    if (child.ordinal == 1) {
      // Ordinal 0's first thread waits in the barrier until its second thread has tried.
      if (!wait_for([&] { return tried->load() != 0; })) return std::string("ordinal 0 never tried");
      comm.barrier();
      comm.barrier();
      return std::string();
    }
    namespace bip = boost::interprocess;
    bip::shared_memory_object shm(bip::open_only, child.segment_name.c_str(), bip::read_only);
    bip::mapped_region region(shm, bip::read_only);
    std::atomic<bool> done{false};
    std::thread first([&] {
      comm.barrier();
      done = true;
    });
    const bool inside = wait_for([&] {
      const OrdinalCall zero = read_calls(region.get_address(), region.get_size(), 2, {})[0];
      return zero.seq == 1 && !zero.returned;
    });
    float x = 1;
    const std::string got =
        inside ? refusal([&] { comm.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum); })
               : std::string("the first thread never entered its barrier");
    tried->store(1);
    first.join();
    if (got.find("already inside a collective call on another thread") == std::string::npos) {
      return "the second thread's call: " + got;
    }
    if (!done) return std::string("the first thread's barrier did not complete");
    comm.barrier();  // and the communicator goes on
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// Replicas forcing different schedules (their own XLA_SPAWN_ALLREDUCE_ALGO) used to run rounds
// that do not pair up and return wrong sums; the schedule is now part of the call.
TEST(MisuseTest, ReplicasForcingDifferentSchedulesFailTheCall) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) -> std::string {
    ShmCommunicatorOptions options;
    options.algorithm =
        child.ordinal == 0 ? AllReduceAlgorithm::kRing : AllReduceAlgorithm::kTwoShot;
    ShmCommunicator comm = child.communicator(options);
    float x = static_cast<float>(child.ordinal + 1);
    try {
      comm.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
      return fmt::format("all_reduce returned {}", x);
    } catch (const PeerFailure& e) {
      const std::string what = e.what();
      if (what.find("schedule forced to ring") == std::string::npos ||
          what.find("schedule forced to twoshot") == std::string::npos) {
        return "unclear: " + what;
      }
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

}  // namespace
}  // namespace xs
