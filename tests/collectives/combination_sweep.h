#pragma once
// The all-reduce tests' sweep: every dtype x op x element count through one reduce call,
// each result checked against the closed form (test_data.h) and fingerprinted into the job's
// scratch, so the parent can check that every ordinal ended with the same bits.
//
//   std::string failures = reduce_all_combinations(child, counts, [&](DType d, ReduceOp op,
//       size_t n) { auto data = make_input(d, child.ordinal, n); comm.all_reduce(...); return data; });
//   expect_bit_identical(job, world_size, combination_count(counts));

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "xla_spawn/collectives/all_reduce_algorithm.h"
#include "tests/collectives/fork_harness.h"

namespace xs::testing {

using Algo = std::optional<AllReduceAlgorithm>;
inline constexpr DType kSweepDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kI32,
                                         DType::kI64};
inline constexpr ReduceOp kSweepOps[] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax,
                                         ReduceOp::kMin};
std::string algo_name(const Algo& algo);  // "auto" when none is forced

using CountsFn = std::function<std::vector<size_t>(DType)>;
// Runs one all_reduce of make_input(dtype, ordinal, n) and returns the result's bytes.
using ReduceFn = std::function<std::vector<std::byte>(DType, ReduceOp, size_t)>;

// Fingerprint slot in the job's scratch area for (combination, ordinal).
uint64_t* fingerprint_slot(std::byte* scratch, size_t combination, int ordinal);
// Every (dtype, op, count); returns the failures (empty when all match), records fingerprints.
std::string reduce_all_combinations(Child& child, const CountsFn& counts, const ReduceFn& reduce);
size_t combination_count(const CountsFn& counts);
// Every combination's fingerprint equal on ordinals 1..N-1 to ordinal 0's (gtest expectations).
void expect_bit_identical(const ForkJob& job, int world_size, size_t combinations);

}  // namespace xs::testing
