#pragma once
// The ops of the lazy runtime, generated from runtime/ops.def: the Op enum, each op's name,
// arity and kind, its attributes, and the shape rule that checks operands when the op is
// recorded (so a mismatch is reported at the call site, naming the op and both shapes).
//
//   ValueType out = infer_type(Op::kAdd, {{{2, 3}, DType::kF32}, {{3}, DType::kF32}}, {});
//   std::string_view n = op_name(Op::kMatmul);   // "matmul"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xla_spawn/base/dtype.h"
#include "xla_spawn/runtime/shape.h"

namespace xs {

enum class OpKind : uint8_t {
  kLeaf, kUnary, kBinary, kWhere, kCast,  // kUnary..kCast are elementwise (fusable)
  kReduce, kLayout, kMatmul, kConv, kIndex, kNorm, kRandom, kCollective
};

enum class Op : uint8_t {
#define XS_OP(en, name, arity, kind, rule, ...) en,
#include "xla_spawn/runtime/ops.def"
#undef XS_OP
};

inline constexpr int kNumOps = 0
#define XS_OP(en, name, arity, kind, rule, ...) +1
#include "xla_spawn/runtime/ops.def"
#undef XS_OP
    ;

// Attributes; which fields an op uses:
//   kConst: scalar = value.             kCast: dtype = target.
//   kSum/kMean/kMax/kMin: ints = axes (sorted, unique), flag = keepdim.
//   kArgmax: ints = {axis}, flag = keepdim.  kReshape/kBroadcast: ints = target shape.
//   kPermute: ints = permutation.       kSlice: ints = {start, stop, step} per axis.
//   kConcat: ints = {axis}.             kPad: ints = {before, after} per axis, scalar = fill.
//   kMatmul: flag bit 0 = transpose a, bit 1 = transpose b (the last two dims); bits 2-4,
//            set only by the compiler (kernels.h, kMatmulCausalOut...), say which blocks of a
//            causal attention's square product can be skipped.
//   kConv2d: ints = {stride_h, stride_w, pad_h, pad_w}.
//   kMaxPool2d/kAvgPool2d: ints = {kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w}.
//   kConv2dGradInput (grad_out, weight): ints = {stride_h, stride_w, pad_h, pad_w, in_h, in_w}.
//   kConv2dGradWeight (input, grad_out): ints = {stride_h, stride_w, pad_h, pad_w, k_h, k_w}.
//   kMaxPool2dGrad (input, grad_out): ints as kMaxPool2d.
//   kAvgPool2dGrad (grad_out): ints as kAvgPool2d, then {in_h, in_w}.
//   kScatterAdd (index, src): ints = {axis, result shape...}; result[.. index ..] += src.
//   kGather: ints = {axis}.             kOneHot: ints = {num_classes}, dtype = result.
//   kEmbedding (table, index).          kEmbeddingGrad (index, grad): ints = {rows of the table}.
//   kLayerNorm (x, gamma, beta): scalar = eps.
//   kLayerNormGrad (x, gamma, grad_y): scalar = eps; flag 0 = grad of x, 1 = grad of gamma.
//   kSoftmax (x), kSoftmaxGrad (y, grad_y): flag 1 = causal over the last two axes.
//   kRandUniform/kRandNormal: ints = shape, dtype = result.  kBernoulli: ints = shape, dtype.
//   kAllReduce: flag = ReduceOp.
struct Attrs {
  std::vector<int64_t> ints;
  double scalar = 0;
  DType dtype = DType::kF32;
  int64_t flag = 0;
  bool operator==(const Attrs&) const = default;
};

// The static type of an IR value.
struct ValueType {
  Shape shape;
  DType dtype = DType::kF32;
  bool operator==(const ValueType&) const = default;
};

struct OpInfo {
  std::string_view name;
  int arity;  // -1: variadic, at least one operand
  OpKind kind;
};

const OpInfo& op_info(Op op);
inline std::string_view op_name(Op op) { return op_info(op).name; }
bool is_elementwise(Op op);
bool is_float(DType dtype);

// Checks the operands of `op` and returns its result type; throws InvalidArgument naming the
// op and the operand shapes/dtypes on a mismatch.
ValueType infer_type(Op op, std::span<const ValueType> operands, const Attrs& attrs);

// "f32[2, 3]"
std::string type_str(const ValueType& type);

}  // namespace xs
