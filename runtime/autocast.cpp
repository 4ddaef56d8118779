#include "xla_spawn/runtime/autocast.h"

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/kernels/onednn.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {
namespace {

thread_local std::optional<DType> t_autocast;

// Where an op runs under autocast. kLower: in the autocast dtype (the GEMM-bound ops, whose
// bf16 kernels accumulate in f32). kF32: in f32 (sums, normalisations, and exp, log, pow,
// rsqrt and reciprocal, whose results bf16's 8 bits distort most, as PyTorch's f32 list). kSame: as its operands are, the widest float dtype when they differ.
enum class Policy { kLower, kF32, kSame, kUntouched };

// A convolution with fewer input channels than this stays f32 under autocast: measured on
// AVX512_BF16 (docs/performance.md, "bf16 GEMM and convolution"), oneDNN's bf16 kernels ran the
// CNN's 1-channel conv1 at 0.72x the runtime's f32 kernel forward, and in f32 the layer keeps
// its fusion with bias, relu and pooling, whose passes over the largest activation cost more
// than the product. At 3 channels bf16 was ahead (1.87x), hence 3.
constexpr int64_t kMinBF16ConvChannels = 3;

Policy autocast_policy(Op op, const std::vector<Tensor>& operands) {
  switch (op) {
    case Op::kMatmul:
      return Policy::kLower;
    case Op::kConv2d:
      return operands.size() >= 2 && operands[1].dim() == 4 &&
                     operands[1].shape()[1] < kMinBF16ConvChannels
                 ? Policy::kF32
                 : Policy::kLower;
    case Op::kSum:
    case Op::kMean:
    case Op::kSoftmax:
    case Op::kLayerNorm:
    case Op::kExp:
    case Op::kLog:
    case Op::kPow:
    case Op::kRsqrt:
    case Op::kReciprocal:
      return Policy::kF32;
    default:
      break;
  }
  switch (op_info(op).kind) {
    case OpKind::kLeaf:
    case OpKind::kCast:
    case OpKind::kRandom:
      return Policy::kUntouched;
    default:
      return Policy::kSame;
  }
}

int width(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return 1;
    case DType::kF32: return 2;
    case DType::kF64: return 3;
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
      return 0;
  }
  return 0;
}

// Every float operand of dtype `from` (any float dtype when `from` is nullopt) cast to `to`.
void cast_floats(std::vector<Tensor>& operands, std::optional<DType> from, DType to) {
  for (Tensor& t : operands) {
    const DType d = t.dtype();
    if (is_float(d) && d != to && (!from || d == *from)) t = cast(t, to);
  }
}

void apply_autocast(Op op, std::vector<Tensor>& operands, DType lower) {
  switch (autocast_policy(op, operands)) {
    case Policy::kLower:
      return cast_floats(operands, DType::kF32, lower);
    case Policy::kF32:
      return cast_floats(operands, lower, DType::kF32);
    case Policy::kSame: {
      DType widest = DType::kBool;
      bool mixed = false;
      for (const Tensor& t : operands) {
        if (!is_float(t.dtype())) continue;
        if (widest != DType::kBool && t.dtype() != widest) mixed = true;
        if (width(t.dtype()) > width(widest)) widest = t.dtype();
      }
      if (mixed) cast_floats(operands, std::nullopt, widest);
      return;
    }
    case Policy::kUntouched:
      return;
  }
}

bool takes_result_dtype(Op op) {
  return op == Op::kCast || op == Op::kOneHot || op_info(op).kind == OpKind::kRandom;
}

}  // namespace

AutocastGuard::AutocastGuard(DType dtype) : previous_(t_autocast) {
  if (dtype != DType::kBF16 && dtype != DType::kF32) {
    throw InvalidArgument(fmt::format("AutocastGuard: autocast to {}; expected bf16 (on) or f32 (off)",
                                      dtype_name(dtype)));
  }
  t_autocast = dtype == DType::kBF16 ? std::optional<DType>(dtype) : std::nullopt;
}

AutocastGuard::~AutocastGuard() { t_autocast = previous_; }

std::optional<DType> autocast_dtype() { return t_autocast; }

std::string bf16_engine() {
  if (!detail::use_onednn_bf16()) return "widened to f32: convert + sgemm";
  return detail::cpu_has_bf16_dot() ? "oneDNN, native bf16 dot products" : "oneDNN, bf16 emulated";
}

bool use_bf16() {
  static const bool on = env_bool(kUseBF16Env).value_or(false);
  return on;
}

DType device_dtype(DType dtype) {
  return dtype == DType::kF32 && use_bf16() ? DType::kBF16 : dtype;
}

namespace detail {

void apply_precision(Op op, std::vector<Tensor>& operands, Attrs& attrs) {
  if (use_bf16()) {
    // Device tensors are never f32: results asked for as f32 are bf16, and f32 leaves the
    // program made before the policy saw them (a loader's batch) are cast on first use.
    if (takes_result_dtype(op)) attrs.dtype = device_dtype(attrs.dtype);
    if (op_info(op).kind != OpKind::kCast && op_info(op).kind != OpKind::kRandom) {
      cast_floats(operands, DType::kF32, DType::kBF16);
    }
    return;
  }
  if (t_autocast) apply_autocast(op, operands, *t_autocast);
}

Tensor autocast_to_f32(const Tensor& x) {
  if (!t_autocast || use_bf16() || x.dtype() != DType::kBF16) return x;
  return cast(x, DType::kF32);
}

Tensor bias_like(const Tensor& b, const Tensor& like) {
  if (!t_autocast || !is_float(b.dtype()) || b.dtype() == like.dtype() || !is_float(like.dtype())) return b;
  return cast(b, like.dtype());
}

}  // namespace detail
}  // namespace xs
