#include "tests/collectives/test_data.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace xs::testing {
namespace {

// Stores the integer `value` (or, for mean, the quotient sum / divisor computed the way the
// dtype defines it) into element `index` of `out`.
void store(std::byte* out, size_t index, DType dtype, int64_t value, int divisor) {
  switch (dtype) {
    case DType::kF32: {
      const float v = static_cast<float>(value) / static_cast<float>(divisor);
      std::memcpy(out + index * 4, &v, 4);
      return;
    }
    case DType::kF64: {
      const double v = static_cast<double>(value) / static_cast<double>(divisor);
      std::memcpy(out + index * 8, &v, 8);
      return;
    }
    case DType::kBF16: {
      const BF16 v = BF16::from_float(static_cast<float>(value) / static_cast<float>(divisor));
      std::memcpy(out + index * 2, &v.bits, 2);
      return;
    }
    case DType::kI32: {
      const auto v = static_cast<int32_t>(value / divisor);
      std::memcpy(out + index * 4, &v, 4);
      return;
    }
    case DType::kI64: {
      const int64_t v = value / divisor;
      std::memcpy(out + index * 8, &v, 8);
      return;
    }
    case DType::kBool: {
      const uint8_t v = value != 0;
      std::memcpy(out + index, &v, 1);
      return;
    }
  }
}

int64_t expected_value(ReduceOp op, int world_size, size_t index) {
  int64_t acc = input_value(0, index);
  for (int o = 1; o < world_size; ++o) {
    const int64_t v = input_value(o, index);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean:
        acc += v;
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
    }
  }
  return acc;
}

}  // namespace

// input_value depends on the index only modulo kPeriod, so one period of elements is
// computed and then repeated (keeps million-element checks cheap).
constexpr size_t kPeriod = 23;

std::vector<std::byte> make_input(DType dtype, int ordinal, size_t n_elems) {
  const size_t elem_bytes = dtype_size(dtype);
  std::byte period[kPeriod * 8];
  for (size_t i = 0; i < kPeriod; ++i) store(period, i, dtype, input_value(ordinal, i), 1);
  std::vector<std::byte> out(n_elems * elem_bytes);
  for (size_t i = 0; i < n_elems; ++i) {
    std::memcpy(out.data() + i * elem_bytes, period + (i % kPeriod) * elem_bytes, elem_bytes);
  }
  return out;
}

size_t count_wrong(const std::vector<std::byte>& result, DType dtype, ReduceOp op, int world_size,
                   std::string* first_error) {
  const size_t elem_bytes = dtype_size(dtype);
  const size_t n_elems = result.size() / elem_bytes;
  const int divisor = op == ReduceOp::kMean ? world_size : 1;
  std::byte period[kPeriod * 8];
  for (size_t i = 0; i < kPeriod; ++i) {
    store(period, i, dtype, expected_value(op, world_size, i), divisor);
  }
  size_t wrong = 0;
  for (size_t i = 0; i < n_elems; ++i) {
    const std::byte* expected = period + (i % kPeriod) * elem_bytes;
    if (std::memcmp(expected, result.data() + i * elem_bytes, elem_bytes) == 0) continue;
    if (wrong++ == 0 && first_error != nullptr) {
      uint64_t got = 0, want = 0;
      std::memcpy(&got, result.data() + i * elem_bytes, elem_bytes);
      std::memcpy(&want, expected, elem_bytes);
      *first_error =
          fmt::format("element {} of {}: bits {:#x}, expected {:#x}", i, n_elems, got, want);
    }
  }
  return wrong;
}

std::vector<std::byte> expected_result(DType dtype, ReduceOp op, int world_size, size_t n_elems) {
  const size_t elem_bytes = dtype_size(dtype);
  const int divisor = op == ReduceOp::kMean ? world_size : 1;
  std::byte period[kPeriod * 8];
  for (size_t i = 0; i < kPeriod; ++i) {
    store(period, i, dtype, expected_value(op, world_size, i), divisor);
  }
  std::vector<std::byte> out(n_elems * elem_bytes);
  for (size_t i = 0; i < n_elems; ++i) {
    std::memcpy(out.data() + i * elem_bytes, period + (i % kPeriod) * elem_bytes, elem_bytes);
  }
  return out;
}

uint64_t fingerprint(const void* data, size_t n_bytes) {
  uint64_t hash = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n_bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}

}  // namespace xs::testing
