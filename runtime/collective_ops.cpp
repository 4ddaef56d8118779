#include "xla_spawn/runtime/collective_ops.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/runtime/detail/shape_rules.h"
#include "xla_spawn/runtime/metrics.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {
namespace {

Attrs world_attrs(int64_t world_size, ReduceOp op = ReduceOp::kSum) {
  Attrs a;
  a.ints = {world_size};
  a.flag = static_cast<int64_t>(op);
  return a;
}

}  // namespace

Tensor reduce_scatter(const Tensor& x, ReduceOp op, int64_t world_size, SourceLoc loc) {
  return record(Op::kReduceScatter, {x}, world_attrs(world_size, op), loc);
}

Tensor all_gather(const Tensor& x, int64_t world_size, SourceLoc loc) {
  return record(Op::kAllGather, {x}, world_attrs(world_size), loc);
}

Tensor local_shard(const std::vector<Tensor>& parts, int64_t world_size, SourceLoc loc) {
  return record(Op::kShard, parts, world_attrs(world_size), loc);
}

}  // namespace xs

namespace xs::detail {
namespace {

[[noreturn]] void fail(Op op, std::span<const ValueType> in, const std::string& why) {
  throw InvalidArgument(fmt::format("{}({}): {}", op_name(op), type_str(in[0]), why));
}

// Shard's parts may have any shape (they are read flat, row-major); the others are 1-D.
int64_t checked_world(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (in.empty()) throw InvalidArgument(fmt::format("{}: no operand", op_name(op)));
  if (attrs.ints.size() != 1 || attrs.ints[0] < 1) fail(op, in, "world size must be >= 1");
  for (const ValueType& t : in) {
    if ((op != Op::kShard && t.shape.size() != 1) || t.dtype != in[0].dtype) {
      fail(op, in, op == Op::kShard ? "needs operands of one dtype" : "needs a 1-D operand");
    }
  }
  if (in[0].dtype == DType::kBool) fail(op, in, "needs a numeric dtype");
  return attrs.ints[0];
}

// Elements [begin, begin + n) of the parts' concatenation into `out`.
void copy_chunk(std::span<const Arg> parts, size_t begin, size_t n, size_t elem, std::byte* out) {
  size_t at = 0;  // where the current part starts in the concatenation
  for (const Arg& part : parts) {
    const size_t len = static_cast<size_t>(numel(part.type->shape));
    const size_t from = std::max(begin, at), to = std::min(begin + n, at + len);
    if (from < to) {
      std::memcpy(out + (from - begin) * elem,
                  static_cast<const std::byte*>(part.data) + (from - at) * elem,
                  (to - from) * elem);
    }
    at += len;
  }
}

}  // namespace

ValueType rule_shard(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  const int64_t world = checked_world(op, in, attrs);
  int64_t total = 0;
  for (const ValueType& t : in) total += numel(t.shape);
  if (total % world != 0) {
    fail(op, in, fmt::format("{} elements do not split into {} chunks", total, world));
  }
  return {{total / world}, in[0].dtype};
}

ValueType rule_reduce_scatter(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  if (attrs.flag < 0 || attrs.flag >= kNumReduceOps) fail(op, in, "bad reduce op");
  if (in.size() != 1) fail(op, in, "takes one operand");
  return rule_shard(op, in, attrs);
}

ValueType rule_all_gather(Op op, std::span<const ValueType> in, const Attrs& attrs) {
  const int64_t world = checked_world(op, in, attrs);
  return {{in[0].shape[0] * world}, in[0].dtype};
}

namespace {

// The op's recorded world size, checked against the runtime's communicator.
int64_t checked_runtime_world(Op op, const Attrs& attrs, const Communicator* comm) {
  const int64_t world = attrs.ints.at(0);
  const int64_t have = comm == nullptr ? 1 : comm->world_size();
  if (world != have) {
    throw InvalidArgument(fmt::format("{}: recorded for world size {}, the runtime's is {}",
                                      op_name(op), world, have));
  }
  return world;
}

}  // namespace

void run_collective_kernel(Op op, const Attrs& attrs, std::span<const Arg> ins, const Arg& out,
                           const ExecEnv& env) {
  Communicator* comm = env.communicator;
  const int64_t world = checked_runtime_world(op, attrs, comm);
  const DType dtype = out.type->dtype;
  const size_t out_n = static_cast<size_t>(numel(out.type->shape));
  const size_t elem = dtype_size(dtype);
  if (op == Op::kShard) {
    const size_t ordinal = comm == nullptr ? 0 : static_cast<size_t>(comm->ordinal());
    return copy_chunk(ins, ordinal * out_n, out_n, elem, static_cast<std::byte*>(out.data));
  }
  const auto* in = static_cast<const std::byte*>(ins[0].data);
  if (world == 1) {
    if (out_n != 0 && out.data != in) std::memmove(out.data, in, out_n * elem);
    return;
  }
  XS_CHECK(env.metrics != nullptr, "{} without metrics", op_name(op));
  ScopedTimer t(*env.metrics, kTimerAllReduceTime);  // all collectives count as all-reduce time
  if (op == Op::kReduceScatter) {
    comm->reduce_scatter(in, out.data, out_n, dtype, static_cast<ReduceOp>(attrs.flag));
  } else {
    comm->all_gather(in, out.data, out_n / static_cast<size_t>(world), dtype);
  }
}

void run_all_gather_pieces(const Attrs& attrs, const Arg& in, std::span<const GatherPiece> pieces,
                           const ExecEnv& env) {
  Communicator* comm = env.communicator;
  const int64_t world = checked_runtime_world(Op::kAllGather, attrs, comm);
  const DType dtype = in.type->dtype;
  const size_t in_n = static_cast<size_t>(numel(in.type->shape));
  if (world == 1) {
    check_gather_pieces(pieces, in_n * dtype_size(dtype));
    return copy_to_pieces(pieces, 0, in.data, in_n * dtype_size(dtype));
  }
  XS_CHECK(env.metrics != nullptr, "all_gather without metrics");
  ScopedTimer t(*env.metrics, kTimerAllReduceTime);  // as run_collective_kernel's
  comm->all_gather_pieces(in.data, pieces, in_n, dtype);
}

}  // namespace xs::detail
