#pragma once
// Multi-head causal self-attention, as in GPT-2: one projection to queries, keys and values,
// scaled dot products batched over (batch, head) by one matmul, a causal mask so position t
// sees only positions <= t, a softmax shifted by each row's max, and an output projection.
// The mask is an additive data tensor (0 or -1e9), one per sequence length, so a new length
// adds a graph but never a constant baked into it.
//
//   CausalSelfAttention attn(/*d_model=*/128, /*heads=*/4, gen);
//   Tensor y = attn(x);                // x [B, T, 128] -> y [B, T, 128]

#include <cstdint>
#include <map>
#include <memory>

#include "runtime/nn/dropout.h"
#include "runtime/nn/generator.h"
#include "runtime/nn/linear.h"
#include "runtime/nn/module.h"

namespace xs {

// [T, T] of `dtype`: 0 where key <= query, -1e9 above the diagonal (exp underflows to 0, and
// unlike -inf it never makes 0 * inf in a gradient).
Tensor causal_mask(int64_t length, DType dtype = DType::kF32);

// softmax(q k^T / sqrt(d) + mask) v for q, k, v [..., T, d] and mask [T, T].
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask);

struct AttentionOptions {
  double dropout = 0;           // on the output projection, in training
  double init_std = 0.02;       // the qkv projection's weights
  double proj_init_std = 0.02;  // the output projection's (GPT-2 scales it by 1/sqrt(2 L))
};

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t d_model, int64_t heads, Generator& gen, AttentionOptions options = {});
  Tensor forward(const Tensor& x) override;

 private:
  const Tensor& mask(int64_t length, DType dtype);

  int64_t d_model_, heads_;
  std::shared_ptr<Linear> qkv_, proj_;
  std::shared_ptr<Dropout> dropout_;
  std::map<std::pair<int64_t, DType>, Tensor> masks_;
};

}  // namespace xs
