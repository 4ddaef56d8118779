#pragma once
// Embedding: a learned table of `num` rows of `dim` values, looked up by integer index (token
// ids, positions). The lookup is one gather op; its gradient adds each looked-up row's
// gradient into the table (embedding_grad), so repeated tokens accumulate.
//
//   Embedding tokens(vocab, 128, gen, /*init_std=*/0.02);
//   Tensor h = tokens(ids);            // ids [B, T] i64 -> h [B, T, 128]

#include <cstdint>

#include "xla_spawn/runtime/nn/generator.h"
#include "xla_spawn/runtime/nn/module.h"

namespace xs {

class Embedding : public Module {
 public:
  // init_std: the rows are drawn from N(0, init_std^2) (PyTorch's default is 1).
  Embedding(int64_t num, int64_t dim, Generator& gen, double init_std = 1.0);
  Tensor forward(const Tensor& index) override;
  Tensor& weight() { return *weight_; }

 private:
  Tensor* weight_;
};

}  // namespace xs
