#include "xla_spawn/runtime/flatten.h"

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/ops.h"

namespace xs {

Tensor flatten_tensors(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> parts;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!parts.empty() && t.dtype() != parts.front().dtype()) {
      throw InvalidArgument(fmt::format("flatten_tensors: mixed dtypes {} and {}",
                                        dtype_name(parts.front().dtype()), dtype_name(t.dtype())));
    }
    parts.push_back(reshape(t, {t.numel()}));
  }
  if (parts.empty()) throw InvalidArgument("flatten_tensors: no defined tensor");
  return parts.size() == 1 ? parts.front() : concat(parts, 0);
}

std::vector<Tensor> unflatten_tensors(const Tensor& flat, const std::vector<Tensor>& like) {
  int64_t total = 0;
  for (const Tensor& t : like) total += t.defined() ? t.numel() : 0;
  if (flat.dim() != 1 || flat.numel() != total) {
    throw InvalidArgument(
        fmt::format("unflatten_tensors: {} does not hold the {} elements of the list",
                    type_str(flat.type()), total));
  }
  std::vector<Tensor> out;
  int64_t at = 0;
  for (const Tensor& t : like) {
    if (!t.defined()) {
      out.emplace_back();
      continue;
    }
    out.push_back(reshape(slice(flat, 0, at, at + t.numel()), t.shape()));
    at += t.numel();
  }
  return out;
}

}  // namespace xs
