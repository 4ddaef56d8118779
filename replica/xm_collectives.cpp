#include "xla_spawn/replica/xm_collectives.h"

#include <cmath>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/runtime/ops.h"

namespace xs::xm {

void all_reduce(std::span<float> data, ReduceOp op) {
  communicator().all_reduce(data.data(), data.size(), DType::kF32, op);
}
void all_reduce(std::span<double> data, ReduceOp op) {
  communicator().all_reduce(data.data(), data.size(), DType::kF64, op);
}
void all_reduce(std::span<int64_t> data, ReduceOp op) {
  communicator().all_reduce(data.data(), data.size(), DType::kI64, op);
}

std::vector<double> all_gather(std::span<const double> in) {
  std::vector<double> out(in.size() * static_cast<size_t>(world_size()));
  communicator().all_gather(in.data(), out.data(), in.size(), DType::kF64);
  return out;
}

std::vector<double> reduce_scatter(std::span<const double> in, ReduceOp op) {
  const auto n = static_cast<size_t>(world_size());
  if (in.size() % n != 0) {
    throw InvalidArgument(
        fmt::format("xm::reduce_scatter: {} elements do not split into {} chunks", in.size(), n));
  }
  std::vector<double> out(in.size() / n);
  communicator().reduce_scatter(in.data(), out.data(), out.size(), DType::kF64, op);
  return out;
}

std::vector<std::vector<std::byte>> rendezvous(const std::string& tag,
                                               std::span<const std::byte> payload) {
  return communicator().rendezvous(tag, payload);
}

double mesh_reduce(const std::string& tag, double value, ReduceOp op) {
  // Through rendezvous (not all_reduce) so the tag catches replicas at different call sites;
  // its own tag space, so a rendezvous of the same tag is a mismatch on both sides; the op
  // travels with the value, so replicas reducing differently all fail.
  struct Payload {
    double value;
    int32_t op;
    int32_t zero = 0;
  };
  const Payload mine{value, static_cast<int32_t>(op)};
  const auto all =
      rendezvous("mesh_reduce:" + tag, std::as_bytes(std::span<const Payload>(&mine, 1)));
  double result = 0;
  for (size_t k = 0; k < all.size(); ++k) {
    XS_CHECK_EQ(all[k].size(), sizeof(Payload), "mesh_reduce payload of ordinal {}", k);
    Payload theirs;
    std::memcpy(&theirs, all[k].data(), sizeof theirs);
    if (theirs.op != mine.op) {
      throw PeerFailure(fmt::format(
          "mesh_reduce '{}': ordinal {} reduces with {}, ordinal {} with {}", tag, ordinal(),
          reduce_op_name(op), k,
          theirs.op >= 0 && theirs.op < kNumReduceOps
              ? std::string(reduce_op_name(static_cast<ReduceOp>(theirs.op)))
              : fmt::format("op {}", theirs.op)));
    }
    const double v = theirs.value;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean:
        result = k == 0 ? v : result + v;
        break;
      case ReduceOp::kMax:  // a NaN anywhere wins, as all_reduce's max
        result = k == 0 || std::isnan(v) || v > result ? v : result;
        break;
      case ReduceOp::kMin:
        result = k == 0 || std::isnan(v) || v < result ? v : result;
        break;
    }
  }
  return op == ReduceOp::kMean ? result / static_cast<double>(all.size()) : result;
}

std::vector<Tensor> all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) {
  if (world_size() == 1) return tensors;
  // One flat buffer per dtype: a handful of large collectives instead of one per tensor.
  std::map<DType, std::vector<size_t>> by_dtype;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].defined()) by_dtype[tensors[i].dtype()].push_back(i);
  }
  std::vector<Tensor> out(tensors.size());
  for (const auto& [dtype, indices] : by_dtype) {
    std::vector<Tensor> flat;
    for (size_t i : indices) flat.push_back(reshape(tensors[i], {-1}));
    const Tensor reduced = all_reduce(flat.size() == 1 ? flat[0] : concat(flat, 0), op);
    int64_t offset = 0;
    for (size_t i : indices) {
      const int64_t n = tensors[i].numel();
      out[i] = reshape(slice(reduced, 0, offset, offset + n), tensors[i].shape());
      offset += n;
    }
  }
  return out;
}

}  // namespace xs::xm
