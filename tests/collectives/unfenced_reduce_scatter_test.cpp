// reduce_scatter_unfenced across forked replicas: with arena operands (the direct form, whose
// last round it posts without waiting) each result stays exact although every replica
// rewrites its operand as soon as its next call returns, also when replicas mix it with the
// fenced reduce_scatter; and a replica killed between the two calls is reported by the others'
// next call, not missed.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>

#include "base/error.h"
#include "tests/collectives/fork_harness.h"

namespace xs::testing {
namespace {

constexpr size_t kStagingBytes = 64 << 10;
constexpr size_t kChunkElems = 40'001;  // odd; the chunks of all ordinals span ~1 MB at N = 4

// Element i of chunk c of ordinal o's operand in iteration `it`: small integers, exact in f32.
float value(int it, int o, int c, size_t i) {
  return static_cast<float>((it * 7 + o * 5 + c * 3 + static_cast<int>(i % 101)) % 64);
}

class UnfencedReduceScatter : public ::testing::TestWithParam<int> {};

TEST_P(UnfencedReduceScatter, StaysExactWhenTheOperandIsRewrittenAfterTheNextCallMixedOrNot) {
  ForkJob job(GetParam(), kStagingBytes);
  job.start([](Child& child) {
    ShmCommunicator comm = child.communicator({.algorithm = std::nullopt, .timeout_ms = 30'000});
    const int n = child.world_size;
    const size_t in_bytes = kChunkElems * static_cast<size_t>(n) * sizeof(float);
    auto* in = static_cast<float*>(comm.alloc_buffer(in_bytes));
    auto* gather_in = static_cast<float*>(comm.alloc_buffer(sizeof(float)));
    if (!comm.in_arena(in, in_bytes)) return std::string("operand not in the arena");
    std::vector<float> out(kChunkElems), gathered(static_cast<size_t>(n));
    for (int it = 0; it < 40; ++it) {
      // The rewrite right after the previous iteration's all_gather: what the unawaited round
      // guards against, were the next call not waiting for it first.
      for (int c = 0; c < n; ++c) {
        for (size_t i = 0; i < kChunkElems; ++i)
          in[c * kChunkElems + i] = value(it, child.ordinal, c, i);
      }
      if ((it + child.ordinal) % 3 == 0) {  // some ordinals fenced, some not, in one call
        comm.reduce_scatter(in, out.data(), kChunkElems, DType::kF32, ReduceOp::kSum);
      } else {
        comm.reduce_scatter_unfenced(in, out.data(), kChunkElems, DType::kF32, ReduceOp::kSum);
      }
      *gather_in = static_cast<float>(it);
      comm.all_gather(gather_in, gathered.data(), 1, DType::kF32);
      for (size_t i = 0; i < kChunkElems; ++i) {
        float want = 0;
        for (int o = 0; o < n; ++o) want += value(it, o, child.ordinal, i);
        if (out[i] != want)
          return fmt::format("iteration {} element {}: {} != {}", it, i, out[i], want);
      }
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

TEST_P(UnfencedReduceScatter, PeerKilledAfterItIsReportedByTheNextCall) {
  const int victim = GetParam() - 1;
  ForkJob job(GetParam(), kStagingBytes);
  job.start([victim](Child& child) {
    ShmCommunicator comm = child.communicator({.algorithm = std::nullopt, .timeout_ms = 30'000});
    const size_t in_bytes = kChunkElems * static_cast<size_t>(child.world_size) * sizeof(float);
    auto* in = static_cast<float*>(comm.alloc_buffer(in_bytes));
    std::memset(in, 0, in_bytes);
    std::vector<float> out(kChunkElems), gathered(static_cast<size_t>(child.world_size));
    comm.reduce_scatter_unfenced(in, out.data(), kChunkElems, DType::kF32, ReduceOp::kSum);
    if (child.ordinal == victim) ::kill(::getpid(), SIGKILL);
    try {
      comm.all_gather(in, gathered.data(), 1, DType::kF32);
    } catch (const Error& e) {
      return std::string(e.what()).find(fmt::format("ordinal {} (pid", victim)) != std::string::npos
                 ? std::string("reported")
                 : fmt::format("an error without the victim: {}", e.what());
    }
    return std::string("the next call returned");
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_FALSE(result.timed_out) << result.describe();
  for (const ChildResult& c : result.children) {
    if (c.ordinal == victim) {
      EXPECT_EQ(c.signal, SIGKILL) << result.describe();
    } else {
      EXPECT_EQ(c.message, "reported") << result.describe();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, UnfencedReduceScatter, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace xs::testing
