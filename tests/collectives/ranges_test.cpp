// ShmCommunicator::reduce_ranges and gather_ranges across forked replicas: operands in every
// arena (the direct forms), on the heap (staging) and mixed; world sizes 2..5; bounds cut on
// cache lines, skewed, and with empty ranges; counts 0, 1, odd and more than the staging.
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/detail/node_pieces.h"
#include "tests/collectives/fork_harness.h"
#include "tests/collectives/test_data.h"

namespace xs::testing {
namespace {

constexpr size_t kStagingBytes = 64 << 10;
const std::vector<size_t> kCounts = {0, 1, 7, 1023, 3 * kStagingBytes / 4 + 5};
constexpr std::tuple<DType, ReduceOp> kReductions[] = {
    {DType::kF32, ReduceOp::kSum}, {DType::kBF16, ReduceOp::kMean}, {DType::kI64, ReduceOp::kMax}};

enum class Operands { kArena, kHeap, kMixed };
enum class Bounds { kCacheLines, kSkewed, kWithEmpty };
constexpr Bounds kAllBounds[] = {Bounds::kCacheLines, Bounds::kSkewed, Bounds::kWithEmpty};

// world_size + 1 offsets from 0 to n.
std::vector<size_t> make_bounds(Bounds kind, size_t n, int world_size, size_t elem_bytes) {
  const auto w = static_cast<size_t>(world_size);
  std::vector<size_t> bounds(w + 1, n);
  switch (kind) {
    case Bounds::kCacheLines:
      return detail::node_cut(n, world_size, elem_bytes);
    case Bounds::kSkewed:  // k^2 / N^2 of n: the last ranges longest, none aligned
      for (size_t k = 0; k < w; ++k) bounds[k] = n * k * k / (w * w);
      return bounds;
    case Bounds::kWithEmpty:  // odd ordinals but the last get nothing, ordinal 0 an odd share
      for (size_t k = 1; k < w; ++k) bounds[k] = k % 2 == 1 ? n / (2 * w) + 3 * k : bounds[k - 1];
      for (size_t k = 0; k <= w; ++k) bounds[k] = std::min(bounds[k], n);
      bounds[0] = 0;
      return bounds;
  }
  return bounds;
}

// Each ordinal's operand: from the arena, or the heap, as `operands` says.
struct Operand {
  Operand(ShmCommunicator& comm, Operands operands, size_t bytes) : comm_(comm) {
    const bool arena =
        operands == Operands::kArena || (operands == Operands::kMixed && comm.ordinal() % 2 == 0);
    if (arena) {
      data = static_cast<std::byte*>(comm.alloc_buffer(bytes));
      owned_ = true;
    } else {
      heap_.resize(bytes);
      data = heap_.data();
    }
  }
  ~Operand() {
    if (owned_) comm_.free_buffer(data);
  }
  std::byte* data = nullptr;

 private:
  ShmCommunicator& comm_;
  std::vector<std::byte> heap_;
  bool owned_ = false;
};

class RangesTest : public ::testing::TestWithParam<std::tuple<int, Operands>> {
 protected:
  void run(const std::function<std::string(Child&, ShmCommunicator&, Operand&)>& body) {
    const auto [world_size, operands] = GetParam();
    ForkJob job(world_size, kStagingBytes);
    job.start([&body, operands = operands](Child& child) {
      ShmCommunicator comm = child.communicator();
      Operand operand(comm, operands, kCounts.back() * 8);
      return body(child, comm, operand);
    });
    const JobResult result = job.wait(std::chrono::seconds(60));
    EXPECT_TRUE(result.all_ok()) << result.describe();
  }
};

// Ordinal k's range holds the closed form and the very bits all_reduce gives there.
TEST_P(RangesTest, ReduceRangesLeavesEachOrdinalsRangeReduced) {
  run([](Child& child, ShmCommunicator& comm, Operand& operand) {
    for (const auto& [dtype, op] : kReductions) {
      const size_t elem_bytes = dtype_size(dtype);
      for (size_t n : kCounts) {
        std::vector<std::byte> reference = make_input(dtype, child.ordinal, n);
        comm.all_reduce(reference.data(), n, dtype, op);
        const std::vector<std::byte> expected = expected_result(dtype, op, child.world_size, n);
        for (Bounds kind : kAllBounds) {
          const std::vector<size_t> bounds = make_bounds(kind, n, child.world_size, elem_bytes);
          const std::vector<std::byte> in = make_input(dtype, child.ordinal, n);
          if (n != 0) std::memcpy(operand.data, in.data(), in.size());
          comm.reduce_ranges(operand.data, n, dtype, op, bounds);
          const size_t at = bounds[child.ordinal] * elem_bytes;
          const size_t bytes = (bounds[child.ordinal + 1] - bounds[child.ordinal]) * elem_bytes;
          // bytes == 0 may come with empty vectors, whose data() memcmp must not be given.
          if (bytes != 0 && (std::memcmp(operand.data + at, expected.data() + at, bytes) != 0 ||
                             std::memcmp(operand.data + at, reference.data() + at, bytes) != 0)) {
            return fmt::format("{} {} n={} bounds {}: range [{}, {}) wrong", dtype_name(dtype),
                               reduce_op_name(op), n, static_cast<int>(kind), bounds[child.ordinal],
                               bounds[child.ordinal + 1]);
          }
        }
      }
    }
    return std::string();
  });
}

TEST_P(RangesTest, GatherRangesCopiesRangeKFromOrdinalK) {
  run([](Child& child, ShmCommunicator& comm, Operand& operand) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF64}) {
      const size_t elem_bytes = dtype_size(dtype);
      for (size_t n : kCounts) {
        for (Bounds kind : kAllBounds) {
          const std::vector<size_t> bounds = make_bounds(kind, n, child.world_size, elem_bytes);
          const std::vector<std::byte> in = make_input(dtype, child.ordinal, n);
          if (n != 0) std::memcpy(operand.data, in.data(), in.size());
          comm.gather_ranges(operand.data, n, dtype, bounds);
          for (int k = 0; k < child.world_size; ++k) {
            const std::vector<std::byte> want = make_input(dtype, k, n);
            const size_t at = bounds[k] * elem_bytes;
            const size_t bytes = (bounds[k + 1] - bounds[k]) * elem_bytes;
            if (bytes != 0 && std::memcmp(operand.data + at, want.data() + at, bytes) != 0) {
              return fmt::format("{} n={} bounds {}: range {} is not ordinal {}'s",
                                 dtype_name(dtype), n, static_cast<int>(kind), k, k);
            }
          }
        }
      }
    }
    return std::string();
  });
}

std::string test_name(const ::testing::TestParamInfo<std::tuple<int, Operands>>& info) {
  static const char* const kNames[] = {"Arena", "Heap", "Mixed"};
  return fmt::format("N{}{}", std::get<0>(info.param),
                     kNames[static_cast<int>(std::get<1>(info.param))]);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, RangesTest,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5),
                                            ::testing::Values(Operands::kArena, Operands::kHeap,
                                                              Operands::kMixed)),
                         test_name);

TEST(RangesMismatchTest, DifferentBoundsAreAPeerFailureNamingBothOrdinals) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    ShmCommunicator comm = child.communicator();
    std::vector<float> data(100, 1.0f);
    const std::vector<size_t> bounds = {0, child.ordinal == 0 ? size_t{48} : size_t{64}, 100};
    try {
      comm.gather_ranges(data.data(), data.size(), DType::kF32, bounds);
      return std::string("no error");
    } catch (const PeerFailure& e) {
      const std::string what = e.what();
      if (what.find("gather_ranges") == std::string::npos ||
          what.find("ordinal 0") == std::string::npos ||
          what.find("ordinal 1") == std::string::npos ||
          what.find("bounds digest") == std::string::npos) {
        return "message lacks the call, both ordinals or the bounds: " + what;
      }
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(30));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

TEST(RangesArgumentTest, BoundsThatDoNotCoverTheBufferAreRejected) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) -> std::string {
    ShmCommunicator comm = child.communicator();
    std::vector<float> data(100);
    const std::vector<std::vector<size_t>> bad = {
        {0, 50}, {0, 50, 99}, {1, 50, 100}, {0, 60, 50, 100}};
    for (const std::vector<size_t>& bounds : bad) {
      try {
        comm.reduce_ranges(data.data(), data.size(), DType::kF32, ReduceOp::kSum, bounds);
        return fmt::format("no error for bounds {}", fmt::join(bounds, ","));
      } catch (const InvalidArgument& e) {
        if (std::string(e.what()).find("reduce_ranges") == std::string::npos)
          return std::string("message lacks the call: ") + e.what();
      }
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(30));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

}  // namespace
}  // namespace xs::testing
