// all_reduce across real forked replicas over a real segment: every world size 1..8, every
// algorithm (forced, and the automatic choice), every dtype, op and a sweep of element
// counts, checked element by element against the closed form and for bit-identity.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/reduce.h"
#include "tests/collectives/combination_sweep.h"
#include "tests/collectives/fork_harness.h"
#include "tests/collectives/test_data.h"

namespace xs::testing {
namespace {

// 64 KiB per ordinal: small, so that buffers "larger than the staging area" stay cheap.
constexpr size_t kStagingBytes = 64 << 10;

// The last count is 2.5 staging halves: a short final slab, which once exposed a layout bug.
std::vector<size_t> counts(DType dtype) {
  return {0, 1, 7, 1023, (size_t{1} << 20) + 3, 5 * kStagingBytes / 4 / dtype_size(dtype) + 5};
}

class AllReduceTest : public ::testing::TestWithParam<std::tuple<int, Algo>> {};

TEST_P(AllReduceTest, MatchesClosedFormAndIsBitIdenticalOnEveryOrdinal) {
  const auto [world_size, algo] = GetParam();
  ForkJob job(world_size, kStagingBytes);
  job.start([algo = algo](Child& child) {
    ShmCommunicator comm = child.communicator({.algorithm = algo, .timeout_ms = {}});
    return reduce_all_combinations(child, counts, [&](DType dtype, ReduceOp op, size_t n) {
      std::vector<std::byte> data = make_input(dtype, child.ordinal, n);
      comm.all_reduce(data.data(), n, dtype, op);
      return data;
    });
  });
  const JobResult result = job.wait(std::chrono::seconds(240));  // slow only when loaded
  ASSERT_TRUE(result.all_ok()) << result.describe();
  expect_bit_identical(job, world_size, combination_count(counts));
}

INSTANTIATE_TEST_SUITE_P(WorldSizesAndAlgorithms, AllReduceTest,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values(Algo{},
                                                              Algo{AllReduceAlgorithm::kRing},
                                                              Algo{AllReduceAlgorithm::kOneShot},
                                                              Algo{AllReduceAlgorithm::kTwoShot},
                                                              Algo{AllReduceAlgorithm::kCma})),
                         [](const auto& info) {
                           return fmt::format("N{}_{}", std::get<0>(info.param),
                                              algo_name(std::get<1>(info.param)));
                         });

// Inexact float sums (random values): every ordinal still ends with the same bits, and the
// one-shot, two-shot and CMA schedules give exactly the canonical order 0..N-1 (the ring
// sums each chunk in ring order, the same on every ordinal).
class AllReduceOrderTest : public ::testing::TestWithParam<std::tuple<int, AllReduceAlgorithm>> {};

// A splitmix64 hash of (ordinal, index) mapped to [-1000, 1000): cheap, reproducible.
float random_value(int ordinal, size_t index) {
  uint64_t z = (static_cast<uint64_t>(ordinal) << 40) + index + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 * 2000.0 - 1000.0);
}

TEST_P(AllReduceOrderTest, InexactSumsAreBitIdenticalAndInFixedOrder) {
  const auto [world_size, algo] = GetParam();
  constexpr size_t kElems = 40'000;  // several slabs of the 64 KiB staging
  ForkJob job(world_size, kStagingBytes);
  job.start([algo = algo](Child& child) {
    ShmCommunicator comm = child.communicator({.algorithm = algo, .timeout_ms = {}});
    std::vector<float> data(kElems);
    for (size_t i = 0; i < kElems; ++i) data[i] = random_value(child.ordinal, i);
    comm.all_reduce(data.data(), kElems, DType::kF32, ReduceOp::kSum);
    *fingerprint_slot(child.scratch, 0, child.ordinal) =
        fingerprint(data.data(), kElems * sizeof(float));
    if (algo == AllReduceAlgorithm::kRing) return std::string();
    for (size_t i = 0; i < kElems; ++i) {
      float expected = random_value(0, i);
      for (int o = 1; o < child.world_size; ++o) expected += random_value(o, i);
      if (std::memcmp(&expected, &data[i], sizeof(float)) != 0) {
        return fmt::format("element {}: {} != canonical-order sum {}", i, data[i], expected);
      }
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_TRUE(result.all_ok()) << result.describe();
  for (int o = 1; o < world_size; ++o) {
    EXPECT_EQ(*fingerprint_slot(job.scratch(), 0, o), *fingerprint_slot(job.scratch(), 0, 0))
        << "ordinal " << o << " differs from ordinal 0";
  }
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizesAndAlgorithms, AllReduceOrderTest,
    ::testing::Combine(::testing::Values(2, 3, 5, 8),
                       ::testing::Values(AllReduceAlgorithm::kRing, AllReduceAlgorithm::kOneShot,
                                         AllReduceAlgorithm::kTwoShot, AllReduceAlgorithm::kCma)),
    [](const auto& info) {
      return fmt::format("N{}_{}", std::get<0>(info.param),
                         all_reduce_algorithm_name(std::get<1>(info.param)));
    });

TEST(AllReduceTest, BoolIsRejectedWithTheDType) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    ShmCommunicator comm = child.communicator();
    bool flags[4] = {};
    try {
      comm.all_reduce(flags, 4, DType::kBool, ReduceOp::kMax);
    } catch (const InvalidArgument& e) {
      return std::string(e.what()).find("bool") != std::string::npos
                 ? std::string()
                 : fmt::format("message lacks the dtype: {}", e.what());
    }
    return std::string("no error for bool");
  });
  const JobResult result = job.wait(std::chrono::seconds(30));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

}  // namespace
}  // namespace xs::testing
