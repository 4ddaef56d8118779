#include "xla_spawn/runtime/nn/attention.h"

#include <cmath>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (q.dim() < 2 || q.shape() != k.shape() || q.shape() != v.shape()) {
    throw InvalidArgument(fmt::format("causal_attention: q {}, k {} and v {} must be one [..., T, d] shape",
                                      shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape())));
  }
  const int64_t d = q.shape().back();
  const Tensor scores = matmul(q, k, false, true) * (1 / std::sqrt(static_cast<double>(d)));
  return matmul(causal_softmax(scores), v);
}

CausalSelfAttention::CausalSelfAttention(int64_t d_model, int64_t heads, Generator& gen,
                                         AttentionOptions options)
    : d_model_(d_model), heads_(heads) {
  if (heads < 1 || d_model < 1 || d_model % heads != 0) {
    throw InvalidArgument(
        fmt::format("CausalSelfAttention: d_model {} must be a positive multiple of heads {}", d_model, heads));
  }
  query_ = std::make_shared<Linear>(d_model, d_model, gen, true, options.init_std);
  key_ = std::make_shared<Linear>(d_model, d_model, gen, true, options.init_std);
  value_ = std::make_shared<Linear>(d_model, d_model, gen, true, options.init_std);
  proj_ = std::make_shared<Linear>(d_model, d_model, gen, true, options.proj_init_std);
  dropout_ = std::make_shared<Dropout>(options.dropout);
  register_module("query", query_);
  register_module("key", key_);
  register_module("value", value_);
  register_module("proj", proj_);
  register_module("dropout", dropout_);
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  if (x.dim() != 3 || x.shape()[2] != d_model_) {
    throw InvalidArgument(fmt::format("CausalSelfAttention: input {}, expected [batch, length, {}]",
                                      shape_str(x.shape()), d_model_));
  }
  const int64_t b = x.shape()[0], t = x.shape()[1], dh = d_model_ / heads_;
  // Three projections rather than one of 3 C and a split: the split's gradient would be three
  // padded copies. Each [B T, C] -> [B, H, T, dh].
  const Tensor rows = reshape(x, {b * t, d_model_});
  auto heads = [&](Linear& proj) { return permute(reshape(proj(rows), {b, t, heads_, dh}), {0, 2, 1, 3}); };
  const Tensor y = causal_attention(heads(*query_), heads(*key_), heads(*value_));
  const Tensor merged = reshape(permute(y, {0, 2, 1, 3}), {b * t, d_model_});
  return (*dropout_)(reshape((*proj_)(merged), {b, t, d_model_}));
}

}  // namespace xs
