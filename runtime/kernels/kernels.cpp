// Dispatcher and the data-movement and reduction kernels.
#include "xla_spawn/runtime/kernels/kernels.h"

#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/runtime/collective_ops.h"
#include "xla_spawn/runtime/element.h"
#include "xla_spawn/runtime/metrics.h"

namespace xs::detail {
namespace {

template <size_t kSize>
void strided_copy_typed(const Shape& shape, const char* src, const std::vector<int64_t>& ss,
                        char* dst, const std::vector<int64_t>& ds) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t n = numel(shape);
  if (n == 0) return;
  if (rank == 0) {
    std::memcpy(dst, src, kSize);
    return;
  }
  const int64_t inner = shape[rank - 1], s_in = ss[rank - 1], d_in = ds[rank - 1];
  std::vector<int64_t> coord(rank, 0);
  int64_t so = 0, dof = 0;
  for (int64_t row = 0; row < n / inner; ++row) {
    if (s_in == 1 && d_in == 1) {
      std::memcpy(dst + dof * kSize, src + so * kSize, inner * kSize);
    } else {
      for (int64_t i = 0; i < inner; ++i)
        std::memcpy(dst + (dof + i * d_in) * kSize, src + (so + i * s_in) * kSize, kSize);
    }
    for (int64_t d = rank - 2; d >= 0; --d) {  // odometer over the outer dims
      so += ss[d];
      dof += ds[d];
      if (++coord[d] < shape[d]) break;
      so -= ss[d] * shape[d];
      dof -= ds[d] * shape[d];
      coord[d] = 0;
    }
  }
}

// Copies the box `shape` from src (element strides ss) to dst (strides ds).
void strided_copy(size_t elem_size, const Shape& shape, const void* src, const std::vector<int64_t>& ss,
                  void* dst, const std::vector<int64_t>& ds) {
  auto s = static_cast<const char*>(src);
  auto d = static_cast<char*>(dst);
  switch (elem_size) {
    case 1: return strided_copy_typed<1>(shape, s, ss, d, ds);
    case 2: return strided_copy_typed<2>(shape, s, ss, d, ds);
    case 4: return strided_copy_typed<4>(shape, s, ss, d, ds);
    case 8: return strided_copy_typed<8>(shape, s, ss, d, ds);
    default: XS_CHECK(false, "strided_copy: element size {}", elem_size);
  }
}

size_t esize(const Arg& a) { return dtype_size(a.type->dtype); }

}  // namespace

void fill_kernel(double value, const Arg& out) {
  const int64_t n = numel(out.type->shape);
  if (n == 0) return;
  store_element(out.data, out.type->dtype, 0, value);
  const size_t sz = esize(out);
  for (int64_t i = 1; i < n; ++i) std::memcpy(static_cast<char*>(out.data) + i * sz, out.data, sz);
}

void permute_kernel(const Attrs& attrs, const Arg& in, const Arg& out) {
  const std::vector<int64_t> in_strides = contiguous_strides(in.type->shape);
  std::vector<int64_t> ss(attrs.ints.size());
  for (size_t d = 0; d < ss.size(); ++d) ss[d] = in_strides[attrs.ints[d]];
  strided_copy(esize(in), out.type->shape, in.data, ss, out.data, contiguous_strides(out.type->shape));
}

void slice_kernel(const Attrs& attrs, const Arg& in, const Arg& out) {
  const std::vector<int64_t> in_strides = contiguous_strides(in.type->shape);
  std::vector<int64_t> ss(in_strides.size());
  int64_t offset = 0;
  for (size_t d = 0; d < ss.size(); ++d) {
    offset += attrs.ints[3 * d] * in_strides[d];
    ss[d] = attrs.ints[3 * d + 2] * in_strides[d];
  }
  const char* src = static_cast<const char*>(in.data) + offset * esize(in);
  strided_copy(esize(in), out.type->shape, src, ss, out.data, contiguous_strides(out.type->shape));
}

void broadcast_kernel(const Arg& in, const Arg& out) {
  strided_copy(esize(in), out.type->shape, in.data, broadcast_strides(in.type->shape, out.type->shape),
               out.data, contiguous_strides(out.type->shape));
}

void pad_kernel(const Attrs& attrs, const Arg& in, const Arg& out) {
  fill_kernel(attrs.scalar, out);
  const std::vector<int64_t> ds = contiguous_strides(out.type->shape);
  int64_t offset = 0;
  for (size_t d = 0; d < ds.size(); ++d) offset += attrs.ints[2 * d] * ds[d];
  char* dst = static_cast<char*>(out.data) + offset * esize(out);
  strided_copy(esize(in), in.type->shape, in.data, contiguous_strides(in.type->shape), dst, ds);
}

void concat_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out) {
  const int64_t axis = attrs.ints[0];
  const Shape& os = out.type->shape;
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= os[d];
  const size_t out_row = numel(Shape(os.begin() + axis, os.end())) * esize(out);
  size_t at = 0;
  for (const Arg& a : ins) {
    const size_t row = numel(Shape(a.type->shape.begin() + axis, a.type->shape.end())) * esize(a);
    for (int64_t o = 0; o < outer; ++o) {
      std::memcpy(static_cast<char*>(out.data) + o * out_row + at,
                  static_cast<const char*>(a.data) + o * row, row);
    }
    at += row;
  }
}

void run_op_kernel(Op op, const Attrs& attrs, std::span<const Arg> ins, const Arg& out,
                   const ExecEnv& env) {
  switch (op) {
    case Op::kConst: return fill_kernel(attrs.scalar, out);
    case Op::kSum: case Op::kMean: case Op::kMax: case Op::kMin:
      return reduce_kernel(op, attrs, ins[0], out);
    case Op::kArgmax: return argmax_kernel(attrs, ins[0], out);
    case Op::kReshape:
      if (ins[0].data != out.data) std::memcpy(out.data, ins[0].data, numel(out.type->shape) * esize(out));
      return;
    case Op::kPermute: return permute_kernel(attrs, ins[0], out);
    case Op::kSlice: return slice_kernel(attrs, ins[0], out);
    case Op::kConcat: return concat_kernel(attrs, ins, out);
    case Op::kBroadcast: return broadcast_kernel(ins[0], out);
    case Op::kPad: return pad_kernel(attrs, ins[0], out);
    case Op::kMatmul:
      if (ins.size() == 4) return matmul_accumulate_kernel(attrs, ins, out);
      return matmul_kernel(attrs, ins[0], ins[1], out);
    case Op::kConv2d: return conv2d_kernel(attrs, ins, out);
    case Op::kMaxPool2d: case Op::kAvgPool2d: return pool2d_kernel(op, attrs, ins, out);
    case Op::kConv2dGradInput: return conv2d_grad_input_kernel(attrs, ins, out);
    case Op::kConv2dGradWeight: return conv2d_grad_weight_kernel(attrs, ins, out);
    case Op::kMaxPool2dGrad: case Op::kAvgPool2dGrad: return pool2d_grad_kernel(op, attrs, ins, out);
    case Op::kScatterAdd: return scatter_add_kernel(attrs, ins[0], ins[1], out);
    case Op::kGather: return gather_kernel(attrs, ins[0], ins[1], out);
    case Op::kOneHot: return one_hot_kernel(attrs, ins[0], out);
    case Op::kEmbedding: return embedding_kernel(ins[0], ins[1], out);
    case Op::kEmbeddingGrad: return embedding_grad_kernel(ins[0], ins[1], out);
    case Op::kLayerNorm: return layer_norm_kernel(attrs, ins, out);
    case Op::kLayerNormGrad: return layer_norm_grad_kernel(attrs, ins, out);
    case Op::kSoftmax: case Op::kSoftmaxGrad: return softmax_kernel(attrs, ins, out);
    case Op::kRandUniform: case Op::kRandNormal: case Op::kBernoulli:
      return random_kernel(op, attrs, ins, out);
    case Op::kAllReduce: {
      const size_t n = numel(out.type->shape);
      if (ins[0].data != out.data) std::memcpy(out.data, ins[0].data, n * esize(out));
      if (env.communicator == nullptr || env.communicator->world_size() == 1) return;
      ScopedTimer t(*env.metrics, kTimerAllReduceTime);
      env.communicator->all_reduce(out.data, n, out.type->dtype, static_cast<ReduceOp>(attrs.flag));
      return;
    }
    case Op::kReduceScatter: case Op::kAllGather: case Op::kShard:
      return run_collective_kernel(op, attrs, ins, out, env);  // runtime/collective_ops.cpp
    default:
      XS_CHECK(false, "run_op_kernel: {} is elementwise or a leaf and has no standalone kernel",
               op_name(op));
  }
}

}  // namespace xs::detail
