#include "xla_spawn/runtime/op.h"

#include <array>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/detail/shape_rules.h"

namespace xs {
namespace {

constexpr std::array<OpInfo, kNumOps> kOpInfos = {{
#define XS_OP(en, name, arity, kind, rule, ...) {name, arity, OpKind::kind},
#include "xla_spawn/runtime/ops.def"
#undef XS_OP
}};

using Rule = ValueType (*)(Op, std::span<const ValueType>, const Attrs&);
constexpr std::array<Rule, kNumOps> kRules = {{
#define XS_OP(en, name, arity, kind, rule, ...) &detail::rule,
#include "xla_spawn/runtime/ops.def"
#undef XS_OP
}};

}  // namespace

const OpInfo& op_info(Op op) { return kOpInfos.at(static_cast<size_t>(op)); }

bool is_elementwise(Op op) {
  const OpKind k = op_info(op).kind;
  return k == OpKind::kUnary || k == OpKind::kBinary || k == OpKind::kWhere ||
         k == OpKind::kCast;
}

bool is_float(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kBF16;
}

ValueType infer_type(Op op, std::span<const ValueType> operands, const Attrs& attrs) {
  const OpInfo& info = op_info(op);
  const int n = static_cast<int>(operands.size());
  if (info.arity >= 0 ? n != info.arity : n < 1) {
    throw InvalidArgument(fmt::format("{}: expected {} operands, got {}", info.name,
                                      info.arity >= 0 ? std::to_string(info.arity) : "1 or more",
                                      n));
  }
  return kRules[static_cast<size_t>(op)](op, operands, attrs);
}

std::string type_str(const ValueType& type) {
  return fmt::format("{}{}", dtype_name(type.dtype), shape_str(type.shape));
}

}  // namespace xs
