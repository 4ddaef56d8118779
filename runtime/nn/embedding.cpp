#include "xla_spawn/runtime/nn/embedding.h"

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/nn/init.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

Embedding::Embedding(int64_t num, int64_t dim, Generator& gen, double init_std) {
  if (num < 1 || dim < 1) throw InvalidArgument(fmt::format("Embedding: {} rows of {} values", num, dim));
  weight_ = &register_parameter("weight", normal_tensor({num, dim}, 0, init_std, gen));
}

Tensor Embedding::forward(const Tensor& index) { return embedding(*weight_, index); }

}  // namespace xs
