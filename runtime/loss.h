#pragma once
// Losses. cross_entropy takes logits and integer class labels and is computed as log-softmax
// (shifted by the row max, so large logits do not overflow) and negative log-likelihood. The
// weighted form takes a per-sample weight (0 masks a padded sample) and the divisor as tensors,
// so a padded last batch uses the same graph as every other batch.
//
//   Tensor loss = cross_entropy(logits, labels);                  // mean over the batch
//   Tensor loss = cross_entropy(logits, labels, mask, n_real);    // sum(mask * nll) / n_real

#include "xla_spawn/runtime/tensor.h"

namespace xs {

// logits [N, C] float, labels [N] i32/i64 in [0, C): mean of -log softmax(logits)[label].
Tensor cross_entropy(const Tensor& logits, const Tensor& labels);
// sum_i weight[i] * nll_i / divisor; weight [N] and divisor (0-d) of the logits' dtype.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& weight,
                     const Tensor& divisor);
// Per-sample negative log-likelihood [N].
Tensor cross_entropy_per_sample(const Tensor& logits, const Tensor& labels);

// mean((prediction - target)^2) over all elements.
Tensor mse_loss(const Tensor& prediction, const Tensor& target);

}  // namespace xs
