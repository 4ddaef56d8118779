// all_reduce on operands from Communicator::alloc_buffer (the zero-copy kDirect schedule)
// across real forked replicas: every world size, dtype, op and a sweep of element counts
// against the closed form and for bit-identity; inexact sums in the canonical order; and
// replicas that pass different kinds of operand (arena and heap) in one call.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "xla_spawn/collectives/reduce.h"
#include "tests/collectives/combination_sweep.h"
#include "tests/collectives/fork_harness.h"
#include "tests/collectives/test_data.h"

namespace xs::testing {
namespace {

constexpr size_t kStagingBytes = 64 << 10;

std::vector<size_t> counts(DType dtype) {
  return {
      0, 1, 7, 1023, 4099, (size_t{1} << 20) + 3, 5 * kStagingBytes / 4 / dtype_size(dtype) + 5};
}

// Runs one all_reduce of make_input(dtype, ordinal, n) in `operand` (n elements of room) and
// returns the result as bytes.
std::vector<std::byte> reduce_in(ShmCommunicator& comm, std::byte* operand, DType dtype,
                                 ReduceOp op, size_t n) {
  std::vector<std::byte> data = make_input(dtype, comm.ordinal(), n);
  if (!data.empty()) std::memcpy(operand, data.data(), data.size());
  comm.all_reduce(operand, n, dtype, op);
  if (!data.empty()) std::memcpy(data.data(), operand, data.size());
  return data;
}

// Every (dtype, op, count) on `operand`; returns the failures, records fingerprints.
std::string reduce_all_combinations(Child& child, ShmCommunicator& comm, std::byte* operand) {
  return reduce_all_combinations(child, counts, [&](DType dtype, ReduceOp op, size_t n) {
    return reduce_in(comm, operand, dtype, op, n);
  });
}

size_t largest_bytes() {
  size_t bytes = 0;
  for (DType dtype : kSweepDTypes) bytes = std::max(bytes, counts(dtype).back() * dtype_size(dtype));
  return std::max(bytes, ((size_t{1} << 20) + 3) * 8);
}

class ArenaAllReduceTest : public ::testing::TestWithParam<std::tuple<int, Algo>> {};

TEST_P(ArenaAllReduceTest, MatchesClosedFormAndIsBitIdenticalOnEveryOrdinal) {
  const auto [world_size, algo] = GetParam();
  ForkJob job(world_size, kStagingBytes);
  job.start([algo = algo](Child& child) {
    ShmCommunicator comm = child.communicator({.algorithm = algo, .timeout_ms = {}});
    auto* operand = static_cast<std::byte*>(comm.alloc_buffer(largest_bytes()));
    if (!comm.in_arena(operand, largest_bytes())) return std::string("operand not in the arena");
    if (child.world_size > 1 &&
        comm.all_reduce_algorithm(1 << 20, true) != AllReduceAlgorithm::kDirect) {
      return std::string("1 MiB arena operands do not run kDirect");
    }
    std::string failures = reduce_all_combinations(child, comm, operand);
    comm.free_buffer(operand);
    return failures;
  });
  const JobResult result = job.wait(std::chrono::seconds(240));  // slow only when loaded
  ASSERT_TRUE(result.all_ok()) << result.describe();
  expect_bit_identical(job, world_size, combination_count(counts));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ArenaAllReduceTest,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values(Algo{},
                                                              Algo{AllReduceAlgorithm::kDirect})),
                         [](const auto& info) {
                           return fmt::format("N{}_{}", std::get<0>(info.param),
                                              algo_name(std::get<1>(info.param)));
                         });

// Even ordinals pass arena operands, odd ones heap memory: every schedule choice must still
// agree (kDirect needs all operands in arenas; the others fall back to CMA or the two-shot).
class MixedOperandTest : public ::testing::TestWithParam<std::tuple<int, Algo>> {};

TEST_P(MixedOperandTest, ArenaAndHeapOperandsInOneCallStillAgree) {
  const auto [world_size, algo] = GetParam();
  ForkJob job(world_size, kStagingBytes);
  job.start([algo = algo](Child& child) {
    ShmCommunicator comm = child.communicator({.algorithm = algo, .timeout_ms = {}});
    std::vector<std::byte> heap(largest_bytes());
    auto* arena = static_cast<std::byte*>(comm.alloc_buffer(largest_bytes()));
    std::string failures =
        reduce_all_combinations(child, comm, child.ordinal % 2 == 0 ? arena : heap.data());
    comm.free_buffer(arena);
    return failures;
  });
  const JobResult result = job.wait(std::chrono::seconds(240));  // slow only when loaded
  ASSERT_TRUE(result.all_ok()) << result.describe();
  expect_bit_identical(job, world_size, combination_count(counts));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MixedOperandTest,
                         ::testing::Combine(::testing::Values(2, 3, 8),
                                            ::testing::Values(Algo{},
                                                              Algo{AllReduceAlgorithm::kDirect})),
                         [](const auto& info) {
                           return fmt::format("N{}_{}", std::get<0>(info.param),
                                              algo_name(std::get<1>(info.param)));
                         });

// A splitmix64 hash of (ordinal, index) mapped to [-1000, 1000).
float random_value(int ordinal, size_t index) {
  uint64_t z = (static_cast<uint64_t>(ordinal) << 40) + index + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 * 2000.0 - 1000.0);
}

class ArenaOrderTest : public ::testing::TestWithParam<int> {};

TEST_P(ArenaOrderTest, InexactSumsAreInTheCanonicalOrderOnEveryOrdinal) {
  const int world_size = GetParam();
  constexpr size_t kElems = 300'001;  // several blocks per chunk, odd tail
  ForkJob job(world_size, kStagingBytes);
  job.start([](Child& child) {
    ShmCommunicator comm = child.communicator();
    auto* data = static_cast<float*>(comm.alloc_buffer(kElems * sizeof(float)));
    for (size_t i = 0; i < kElems; ++i) data[i] = random_value(child.ordinal, i);
    comm.all_reduce(data, kElems, DType::kF32, ReduceOp::kSum);
    std::string failure;
    for (size_t i = 0; i < kElems && failure.empty(); ++i) {
      float expected = random_value(0, i);
      for (int o = 1; o < child.world_size; ++o) expected += random_value(o, i);
      if (std::memcmp(&expected, &data[i], sizeof(float)) != 0) {
        failure = fmt::format("element {}: {} != canonical-order sum {}", i, data[i], expected);
      }
    }
    comm.free_buffer(data);
    return failure;
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_TRUE(result.all_ok()) << result.describe();
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ArenaOrderTest, ::testing::Values(2, 3, 5, 8));

}  // namespace
}  // namespace xs::testing
