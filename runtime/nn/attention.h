#pragma once
// Multi-head causal self-attention, as in GPT-2: projections to queries, keys and values,
// scaled dot products batched over (batch, head) by one matmul, a causal softmax (one op that
// shifts each row by its max and leaves position t's later columns at 0 without computing
// them), and an output projection.
//
//   CausalSelfAttention attn(/*d_model=*/128, /*heads=*/4, gen);
//   Tensor y = attn(x);                // x [B, T, 128] -> y [B, T, 128]

#include <cstdint>
#include <memory>

#include "xla_spawn/runtime/nn/dropout.h"
#include "xla_spawn/runtime/nn/generator.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/nn/module.h"

namespace xs {

// causal_softmax(q k^T / sqrt(d)) v for q, k, v [..., T, d].
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v);

struct AttentionOptions {
  double dropout = 0;           // on the output projection, in training
  double init_std = 0.02;       // the query, key and value projections' weights
  double proj_init_std = 0.02;  // the output projection's (GPT-2 scales it by 1/sqrt(2 L))
};

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t d_model, int64_t heads, Generator& gen, AttentionOptions options = {});
  Tensor forward(const Tensor& x) override;

 private:
  int64_t d_model_, heads_;
  std::shared_ptr<Linear> query_, key_, value_, proj_;
  std::shared_ptr<Dropout> dropout_;
};

}  // namespace xs
