#pragma once
// A small decoder-only transformer (GPT-2's layout, no weight tying): token and learned
// position embeddings, `layers` pre-LayerNorm blocks of causal multi-head self-attention and a
// 4x GELU MLP with residual connections, a final LayerNorm and a linear head over the
// vocabulary. Initialised as GPT-2: N(0, 0.02) weights, the residual projections' scaled by
// 1/sqrt(2 layers), zero biases.
//
//   Gpt model(GptConfig{.vocab = 75}, /*seed=*/0);
//   Tensor logits = model(tokens);     // tokens [B, T] i64 -> logits [B T, vocab]

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "xla_spawn/runtime/nn/attention.h"
#include "xla_spawn/runtime/nn/embedding.h"
#include "xla_spawn/runtime/nn/layer_norm.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/nn/module.h"

namespace xs::lm {

struct GptConfig {
  int64_t vocab = 0;
  int64_t layers = 4;
  int64_t d_model = 128;
  int64_t heads = 4;
  int64_t context = 128;  // rows of the position table: the longest sequence
  double dropout = 0;     // after attention and the MLP, in training
  // "L4-D128-H4-T128-V75": what a checkpoint must match.
  std::string name() const;
};

class GptBlock : public Module {
 public:
  GptBlock(const GptConfig& config, Generator& gen);
  Tensor forward(const Tensor& x) override;  // [B, T, C] -> [B, T, C]

 private:
  std::shared_ptr<LayerNorm> ln1_, ln2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<Linear> fc_, proj_;
  std::shared_ptr<Dropout> dropout_;
};

class Gpt : public Module {
 public:
  Gpt(const GptConfig& config, uint64_t seed);
  // tokens [B, T] (i64), T <= context -> logits [B T, vocab].
  Tensor forward(const Tensor& tokens) override;
  const GptConfig& config() const { return config_; }

 private:
  const Tensor& positions(int64_t length);

  GptConfig config_;
  std::shared_ptr<Embedding> tokens_, positions_table_;
  std::vector<std::shared_ptr<GptBlock>> blocks_;
  std::shared_ptr<LayerNorm> ln_f_;
  std::shared_ptr<Linear> head_;
  std::map<int64_t, Tensor> position_ids_;  // 0..T-1 per length, data so no graph bakes them in
};

}  // namespace xs::lm
