#pragma once
// Reading and writing single elements of any dtype as double (or int64 for exact integers):
// the slow, general path used by host transfers, printing and constant folding.
//
//   double v = load_element(buf->data(), DType::kBF16, i);
//   store_element(out, DType::kI32, i, 7.0);

#include <cstdint>
#include <type_traits>

#include "xla_spawn/base/dtype.h"

namespace xs {

double load_element(const void* base, DType dtype, int64_t i);
void store_element(void* base, DType dtype, int64_t i, double value);
int64_t load_element_i64(const void* base, DType dtype, int64_t i);

// The dtype of a host element type; BF16 maps to kBF16, bool and uint8_t to kBool.
template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  else if constexpr (std::is_same_v<T, double>) return DType::kF64;
  else if constexpr (std::is_same_v<T, BF16>) return DType::kBF16;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::kI32;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::kI64;
  else {
    static_assert(std::is_same_v<T, bool> || std::is_same_v<T, uint8_t>, "unsupported element type");
    return DType::kBool;
  }
}

}  // namespace xs
