#include "xla_spawn/runtime/state_dict.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autocast.h"
#include "xla_spawn/runtime/element.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {

namespace {

Tensor tensor_of(const HostTensorData& e) {
  const size_t need = static_cast<size_t>(numel(e.shape)) * dtype_size(e.dtype);
  if (e.bytes.size() != need) {
    throw InvalidArgument(fmt::format("state dict entry '{}': {} bytes for {} (needs {})", e.name,
                                      e.bytes.size(), type_str({e.shape, e.dtype}), need));
  }
  BufferPtr buf = Buffer::allocate(need);
  if (need > 0) std::memcpy(buf->data(), e.bytes.data(), need);
  return Tensor::from_buffer(std::move(buf), {e.shape, e.dtype});
}

}  // namespace

bool loads_as(DType stored, DType target) {
  const auto f32_or_bf16 = [](DType d) { return d == DType::kF32 || d == DType::kBF16; };
  return stored == target || (f32_or_bf16(stored) && f32_or_bf16(target));
}

HostTensorData converted(const HostTensorData& e, DType dtype) {
  if (e.dtype == dtype) return e;
  XS_CHECK(loads_as(e.dtype, dtype), "converted: entry '{}' from {} to {}", e.name,
           dtype_name(e.dtype), dtype_name(dtype));
  const int64_t n = numel(e.shape);
  XS_CHECK_ARG(e.bytes.size() == static_cast<size_t>(n) * dtype_size(e.dtype),
               "state dict entry '{}': {} bytes for {}", e.name, e.bytes.size(),
               type_str({e.shape, e.dtype}));
  HostTensorData out{e.name, dtype, e.shape, {}};
  out.bytes.resize(static_cast<size_t>(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i)
    store_element(out.bytes.data(), dtype, i, load_element(e.bytes.data(), e.dtype, i));
  return out;
}

StateDict to_state_dict(const NamedTensors& named) {
  if (std::any_of(named.begin(), named.end(),
                  [](const auto& nt) { return nt.second.is_pending(); }))
    mark_step();
  StateDict out;
  for (const auto& [name, t] : named) {
    HostTensorData e{name, t.dtype(), t.shape(), {}};
    const BufferPtr buf = t.buffer();
    e.bytes.resize(static_cast<size_t>(t.numel()) * dtype_size(t.dtype()));
    if (!e.bytes.empty()) std::memcpy(e.bytes.data(), buf->data(), e.bytes.size());
    out.push_back(e.dtype == DType::kBF16 && use_bf16() ? converted(e, DType::kF32) : std::move(e));
  }
  return out;
}

NamedTensors to_tensors(const StateDict& state) {
  NamedTensors out;
  for (const HostTensorData& e : state) out.emplace_back(e.name, tensor_of(e));
  return out;
}

void load_state_dict(const NamedTensors& named, const StateDict& state) {
  std::unordered_map<std::string, const HostTensorData*> by_name;
  for (const HostTensorData& e : state) by_name[e.name] = &e;
  if (by_name.size() != named.size()) {
    throw InvalidArgument(fmt::format("load_state_dict: {} entries, the model has {} tensors",
                                      state.size(), named.size()));
  }
  std::vector<Tensor> values;
  for (const auto& [name, t] : named) {
    auto it = by_name.find(name);
    if (it == by_name.end())
      throw InvalidArgument(fmt::format("load_state_dict: no entry '{}'", name));
    const HostTensorData& e = *it->second;
    if (e.shape != t.shape() || !loads_as(e.dtype, t.dtype())) {
      throw InvalidArgument(
          fmt::format("load_state_dict: entry '{}' is {}, the model's tensor is {}", name,
                      type_str({e.shape, e.dtype}), type_str(t.type())));
    }
    values.push_back(tensor_of(converted(e, t.dtype())));
  }
  for (size_t i = 0; i < named.size(); ++i) Tensor(named[i].second).assign(values[i]);
}

}  // namespace xs
