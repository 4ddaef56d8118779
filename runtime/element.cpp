#include "xla_spawn/runtime/element.h"

#include <cmath>

namespace xs {

double load_element(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF64: return static_cast<const double*>(base)[i];
    case DType::kBF16: return static_cast<const BF16*>(base)[i].to_float();
    case DType::kI32: return static_cast<const int32_t*>(base)[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::kBool: return static_cast<const uint8_t*>(base)[i] != 0 ? 1.0 : 0.0;
  }
  return 0;  // unreachable: every dtype handled above
}

int64_t load_element_i64(const void* base, DType dtype, int64_t i) {
  if (dtype == DType::kI64) return static_cast<const int64_t*>(base)[i];
  return static_cast<int64_t>(load_element(base, dtype, i));
}

void store_element(void* base, DType dtype, int64_t i, double value) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(base)[i] = static_cast<float>(value); return;
    case DType::kF64: static_cast<double*>(base)[i] = value; return;
    case DType::kBF16: static_cast<BF16*>(base)[i] = BF16::from_float(static_cast<float>(value)); return;
    case DType::kI32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(value); return;
    case DType::kI64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(value); return;
    case DType::kBool: static_cast<uint8_t*>(base)[i] = value != 0 ? 1 : 0; return;
  }
}

}  // namespace xs
