#pragma once
// Test data for collectives: element values derived from (ordinal, index) so a misplaced
// element is caught, small integers so every dtype and every summation order is exact, and
// the closed-form expected result of each reduction.
//
//   std::vector<std::byte> buf = xs::testing::make_input(DType::kBF16, ordinal, n);
//   size_t bad = xs::testing::count_wrong(buf, DType::kBF16, ReduceOp::kMean, world_size, &why);

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "xla_spawn/base/dtype.h"

namespace xs::testing {

// In [-11, 11]: sums of up to 8 ordinals stay exact even in bf16 (8 significant bits).
inline int64_t input_value(int ordinal, size_t index) {
  return static_cast<int64_t>((static_cast<uint64_t>(ordinal) * 37 + index * 11) % 23) - 11;
}

std::vector<std::byte> make_input(DType dtype, int ordinal, size_t n_elems);

// Elements of `result` that differ (bitwise) from the closed form of reducing every
// ordinal's make_input with `op`; `first_error` describes the first one.
size_t count_wrong(const std::vector<std::byte>& result, DType dtype, ReduceOp op, int world_size,
                   std::string* first_error);

// The closed form count_wrong checks against: n_elems elements of reducing every ordinal's
// make_input with `op`.
std::vector<std::byte> expected_result(DType dtype, ReduceOp op, int world_size, size_t n_elems);

// FNV-1a of the bytes: compared across ordinals for bit-identity.
uint64_t fingerprint(const void* data, size_t n_bytes);

}  // namespace xs::testing
