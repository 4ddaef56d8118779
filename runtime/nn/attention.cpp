#include "runtime/nn/attention.h"

#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/ops.h"

namespace xs {

Tensor causal_mask(int64_t length, DType dtype) {
  if (length < 1) throw InvalidArgument(fmt::format("causal_mask: length {} (>= 1)", length));
  std::vector<double> bias(static_cast<size_t>(length * length), 0.0);
  for (int64_t q = 0; q < length; ++q) {
    for (int64_t k = q + 1; k < length; ++k) bias[q * length + k] = -1e9;
  }
  return Tensor::from_vector<double>(bias, {length, length}, dtype);
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  if (q.dim() < 2 || q.shape() != k.shape() || q.shape() != v.shape()) {
    throw InvalidArgument(fmt::format("causal_attention: q {}, k {} and v {} must be one [..., T, d] shape",
                                      shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape())));
  }
  const int64_t t = q.shape()[q.dim() - 2], d = q.shape().back();
  if (mask.shape() != Shape{t, t}) {
    throw InvalidArgument(
        fmt::format("causal_attention: mask {} for sequences of {}", shape_str(mask.shape()), t));
  }
  const Tensor scores = matmul(q, k, false, true) * (1 / std::sqrt(static_cast<double>(d))) + mask;
  return matmul(softmax(scores, -1), v);
}

CausalSelfAttention::CausalSelfAttention(int64_t d_model, int64_t heads, Generator& gen,
                                         AttentionOptions options)
    : d_model_(d_model), heads_(heads) {
  if (heads < 1 || d_model < 1 || d_model % heads != 0) {
    throw InvalidArgument(
        fmt::format("CausalSelfAttention: d_model {} must be a positive multiple of heads {}", d_model, heads));
  }
  qkv_ = std::make_shared<Linear>(d_model, 3 * d_model, gen, true, options.init_std);
  proj_ = std::make_shared<Linear>(d_model, d_model, gen, true, options.proj_init_std);
  dropout_ = std::make_shared<Dropout>(options.dropout);
  register_module("qkv", qkv_);
  register_module("proj", proj_);
  register_module("dropout", dropout_);
}

const Tensor& CausalSelfAttention::mask(int64_t length, DType dtype) {
  auto [it, added] = masks_.try_emplace({length, dtype});
  if (added) it->second = causal_mask(length, dtype);
  return it->second;
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  if (x.dim() != 3 || x.shape()[2] != d_model_) {
    throw InvalidArgument(fmt::format("CausalSelfAttention: input {}, expected [batch, length, {}]",
                                      shape_str(x.shape()), d_model_));
  }
  const int64_t b = x.shape()[0], t = x.shape()[1], dh = d_model_ / heads_;
  // [B T, 3 C] -> [3, B, H, T, dh]: one GEMM for all three projections, one copy to split them.
  const Tensor qkv = permute(reshape((*qkv_)(reshape(x, {b * t, d_model_})), {b, t, 3, heads_, dh}),
                             {2, 0, 3, 1, 4});
  auto part = [&](int64_t i) { return reshape(slice(qkv, 0, i, i + 1), {b, heads_, t, dh}); };
  const Tensor y = causal_attention(part(0), part(1), part(2), mask(t, x.dtype()));
  const Tensor merged = reshape(permute(y, {0, 2, 1, 3}), {b * t, d_model_});
  return (*dropout_)(reshape((*proj_)(merged), {b, t, d_model_}));
}

}  // namespace xs
