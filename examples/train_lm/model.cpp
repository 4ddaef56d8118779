#include "examples/train_lm/model.h"

#include <cmath>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/ops.h"

namespace xs::lm {
namespace {

constexpr double kInitStd = 0.02;  // GPT-2's

}  // namespace

std::string GptConfig::name() const {
  return fmt::format("L{}-D{}-H{}-T{}-V{}", layers, d_model, heads, context, vocab);
}

GptBlock::GptBlock(const GptConfig& c, Generator& gen) {
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(c.layers));
  ln1_ = std::make_shared<LayerNorm>(c.d_model);
  attn_ = std::make_shared<CausalSelfAttention>(
      c.d_model, c.heads, gen,
      AttentionOptions{.dropout = c.dropout, .init_std = kInitStd, .proj_init_std = residual_std});
  ln2_ = std::make_shared<LayerNorm>(c.d_model);
  fc_ = std::make_shared<Linear>(c.d_model, 4 * c.d_model, gen, true, kInitStd);
  proj_ = std::make_shared<Linear>(4 * c.d_model, c.d_model, gen, true, residual_std);
  dropout_ = std::make_shared<Dropout>(c.dropout);
  register_module("ln1", ln1_);
  register_module("attn", attn_);
  register_module("ln2", ln2_);
  register_module("fc", fc_);
  register_module("proj", proj_);
  register_module("dropout", dropout_);
}

Tensor GptBlock::forward(const Tensor& x) {
  const Tensor h = x + (*attn_)((*ln1_)(x));
  const Shape& s = h.shape();
  const Tensor rows = reshape((*ln2_)(h), {s[0] * s[1], s[2]});
  return h + (*dropout_)(reshape((*proj_)(gelu((*fc_)(rows))), s));
}

Gpt::Gpt(const GptConfig& config, uint64_t seed) : config_(config) {
  const GptConfig& c = config_;
  if (c.vocab < 2 || c.layers < 1 || c.context < 1 || c.heads < 1 || c.d_model % c.heads != 0 ||
      !(c.dropout >= 0 && c.dropout < 1)) {
    throw InvalidArgument(fmt::format("Gpt: vocab {} (>= 2), layers {}, context {}, d_model {} a multiple of "
                                      "heads {}, dropout {} in [0, 1)",
                                      c.vocab, c.layers, c.context, c.d_model, c.heads, c.dropout));
  }
  Generator gen(seed);
  tokens_ = std::make_shared<Embedding>(c.vocab, c.d_model, gen, kInitStd);
  positions_table_ = std::make_shared<Embedding>(c.context, c.d_model, gen, kInitStd);
  register_module("tokens", tokens_);
  register_module("positions", positions_table_);
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks_.push_back(std::make_shared<GptBlock>(c, gen));
    register_module(fmt::format("blocks.{}", i), blocks_.back());
  }
  ln_f_ = std::make_shared<LayerNorm>(c.d_model);
  head_ = std::make_shared<Linear>(c.d_model, c.vocab, gen, false, kInitStd);
  register_module("ln_f", ln_f_);
  register_module("head", head_);
}

const Tensor& Gpt::positions(int64_t length) {
  auto [it, added] = position_ids_.try_emplace(length);
  if (added) {
    std::vector<int64_t> ids(static_cast<size_t>(length));
    for (int64_t i = 0; i < length; ++i) ids[i] = i;
    it->second = Tensor::from_vector<int64_t>(ids, {length});
  }
  return it->second;
}

Tensor Gpt::forward(const Tensor& tokens) {
  if (tokens.dim() != 2 || (tokens.dtype() != DType::kI64 && tokens.dtype() != DType::kI32)) {
    throw InvalidArgument(fmt::format("Gpt: tokens {} {}, expected integer [batch, length]",
                                      dtype_name(tokens.dtype()), shape_str(tokens.shape())));
  }
  const int64_t b = tokens.shape()[0], t = tokens.shape()[1];
  if (t > config_.context) {
    throw InvalidArgument(fmt::format("Gpt: a sequence of {} tokens is longer than the {} positions the model has "
                                      "(its context)",
                                      t, config_.context));
  }
  Tensor x = (*tokens_)(tokens) + (*positions_table_)(positions(t));
  for (const auto& block : blocks_) x = (*block)(x);
  return (*head_)(reshape((*ln_f_)(x), {b * t, config_.d_model}));
}

}  // namespace xs::lm
