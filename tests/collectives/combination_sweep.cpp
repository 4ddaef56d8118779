#include "tests/collectives/combination_sweep.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "tests/collectives/test_data.h"

namespace xs::testing {
uint64_t* fingerprint_slot(std::byte* scratch, size_t combination, int ordinal) {
  return reinterpret_cast<uint64_t*>(scratch) + combination * 8 + ordinal;
}

std::string algo_name(const Algo& algo) {
  return algo ? std::string(all_reduce_algorithm_name(*algo)) : "auto";
}

std::string reduce_all_combinations(Child& child, const CountsFn& counts, const ReduceFn& reduce) {
  std::string failures;
  size_t combination = 0;
  for (DType dtype : kSweepDTypes) {
    for (ReduceOp op : kSweepOps) {
      for (size_t n : counts(dtype)) {
        const std::vector<std::byte> data = reduce(dtype, op, n);
        std::string why;
        if (const size_t wrong = count_wrong(data, dtype, op, child.world_size, &why)) {
          failures += fmt::format("{} {} n={}: {} wrong, {}\n", dtype_name(dtype),
                                  reduce_op_name(op), n, wrong, why);
        }
        *fingerprint_slot(child.scratch, combination++, child.ordinal) =
            fingerprint(data.data(), data.size());
      }
    }
  }
  return failures;
}

size_t combination_count(const CountsFn& counts) {
  size_t combinations = 0;
  for (DType dtype : kSweepDTypes) combinations += std::size(kSweepOps) * counts(dtype).size();
  return combinations;
}

void expect_bit_identical(const ForkJob& job, int world_size, size_t combinations) {
  for (size_t c = 0; c < combinations; ++c) {
    for (int o = 1; o < world_size; ++o) {
      EXPECT_EQ(*fingerprint_slot(job.scratch(), c, o), *fingerprint_slot(job.scratch(), c, 0))
          << "combination " << c << " differs between ordinal " << o << " and ordinal 0";
    }
  }
}

}  // namespace xs::testing
