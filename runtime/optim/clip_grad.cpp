#include "xla_spawn/runtime/optim/clip_grad.h"

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

namespace {

void check_max_norm(double max_norm) {
  if (!(max_norm > 0))
    throw InvalidArgument(fmt::format("clip_grad_norm: max_norm {} must be > 0", max_norm));
}

}  // namespace

Tensor sum_of_squares(const std::vector<Tensor>& grads) {
  NoGradGuard no_grad;
  Tensor total;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    const Tensor s = sum(square(g.dtype() == DType::kF32 ? g : cast(g, DType::kF32)));
    total = total.defined() ? total + s : s;
  }
  return total;
}

Tensor clip_gradients(std::vector<Tensor>& grads, double max_norm) {
  check_max_norm(max_norm);
  const Tensor total = sum_of_squares(grads);
  if (!total.defined()) return Tensor::full_data({}, 0);
  return clip_to_norm(grads, total, max_norm);
}

Tensor clip_to_norm(std::vector<Tensor>& grads, const Tensor& sum_of_squares, double max_norm) {
  check_max_norm(max_norm);
  NoGradGuard no_grad;
  const Tensor norm = sqrt(sum_of_squares);
  const Tensor coef = minimum(Tensor::full_data({}, max_norm) / (norm + 1e-6), Tensor::scalar(1));
  for (Tensor& g : grads) {
    if (g.defined()) g = g * (g.dtype() == DType::kF32 ? coef : cast(coef, g.dtype()));
  }
  return norm;
}

Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params) grads.push_back(p.grad());
  const Tensor norm = clip_gradients(grads, max_norm);
  for (size_t i = 0; i < params.size(); ++i) {
    if (grads[i].defined()) Tensor(params[i]).set_grad(grads[i]);
  }
  return norm;
}

}  // namespace xs
