#pragma once
// State dicts: named tensors (module parameters and buffers, optimizer state) to and from plain
// host copies (name, dtype, shape, bytes), which the replica layer's checkpoint format stores.
// The runtime does not depend on that format.
//
//   StateDict sd = to_state_dict(model.named_state());     // runs pending work first
//   load_state_dict(model.named_state(), sd);              // checks names, shapes, dtypes
// Under XLA_SPAWN_USE_BF16 the host copies of bf16 tensors are f32, and f32 and bf16 entries
// load into tensors of either dtype, so checkpoints move between f32 and bf16 runs.

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

// Whether an entry stored as `stored` loads into a tensor of dtype `target`: the same dtype, or
// f32 and bf16 either way.
bool loads_as(DType stored, DType target);
// `e` with its values converted to `dtype` (f32 to bf16 rounds to nearest even; bf16 to f32 is
// exact); `e` itself when it has that dtype.
HostTensorData converted(const HostTensorData& e, DType dtype);

// Copies every tensor to the host (one mark_step if any is pending, so the step's graph is
// not split into host reads).
StateDict to_state_dict(const NamedTensors& named);

// Replaces each named tensor's value by the entry of the same name (as materialised data: no
// graph change). Throws InvalidArgument naming the entry on a missing or extra name, a shape,
// dtype (see loads_as) or byte-size mismatch; nothing is changed then.
void load_state_dict(const NamedTensors& named, const StateDict& state);

// The entries as materialised tensors (for Optimizer::load_state).
NamedTensors to_tensors(const StateDict& state);

}  // namespace xs
