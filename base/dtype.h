#pragma once
// Element types and reduction operators shared by the collectives and the runtime, so a
// tensor's dtype is handed to an all-reduce without translation.
//
//   size_t bytes = n_elems * xs::dtype_size(DType::kF32);
//   spdlog::info("{} {}", xs::dtype_name(dtype), xs::reduce_op_name(op));

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace xs {

enum class DType : uint8_t { kF32, kF64, kBF16, kI32, kI64, kBool };
inline constexpr int kNumDTypes = 6;

enum class ReduceOp : uint8_t { kSum, kMean, kMax, kMin };
inline constexpr int kNumReduceOps = 4;

constexpr size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kBool: return 1;
  }
  return 0;  // unreachable: every enumerator is handled above
}

constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kBool: return "bool";
  }
  return "?";
}

constexpr std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMean: return "mean";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

// bfloat16: the upper 16 bits of an IEEE f32. Conversion from f32 rounds to nearest even;
// NaN stays NaN (quiet).
struct BF16 {
  uint16_t bits = 0;

  static BF16 from_float(float value) {
    uint32_t u;
    std::memcpy(&u, &value, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return BF16{static_cast<uint16_t>((u >> 16) | 0x40u)};
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return BF16{static_cast<uint16_t>((u + rounding) >> 16)};
  }
  float to_float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &u, sizeof value);
    return value;
  }
};
static_assert(sizeof(BF16) == 2);

}  // namespace xs
