#pragma once
// State dicts: named tensors (module parameters and buffers, optimizer state) to and from plain
// host copies (name, dtype, shape, bytes), which the replica layer's checkpoint format stores.
// The runtime does not depend on that format.
//
//   StateDict sd = to_state_dict(model.named_state());     // runs pending work first
//   load_state_dict(model.named_state(), sd);              // checks names, shapes, dtypes

#include <cstdint>
#include <string>
#include <vector>

#include "xla_spawn/base/dtype.h"
#include "xla_spawn/runtime/nn/module.h"

namespace xs {

struct HostTensorData {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<uint8_t> bytes;  // row-major, numel(shape) * dtype_size(dtype)
};

using StateDict = std::vector<HostTensorData>;

// Copies every tensor to the host (one mark_step if any is pending, so the step's graph is
// not split into host reads).
StateDict to_state_dict(const NamedTensors& named);

// Replaces each named tensor's value by the entry of the same name (as materialised data: no
// graph change). Throws InvalidArgument naming the entry on a missing or extra name, a shape,
// dtype or byte-size mismatch; nothing is changed then.
void load_state_dict(const NamedTensors& named, const StateDict& state);

// The entries as materialised tensors (for Optimizer::load_state).
NamedTensors to_tensors(const StateDict& state);

}  // namespace xs
