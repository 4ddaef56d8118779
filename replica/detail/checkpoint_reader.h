#pragma once
// Validation helpers shared by the checkpoint writer and parser (parse_checkpoint itself is
// declared in replica/checkpoint.h and defined in checkpoint_reader.cpp).
//
//   std::optional<uint64_t> n = xs::detail::tensor_bytes(shape, DType::kF32);  // nullopt: overflow

#include <cstdint>
#include <optional>
#include <span>

#include "xla_spawn/base/dtype.h"

namespace xs::detail {

// n_elems(shape) * dtype_size(dtype), or nullopt when a dim is negative or the product
// exceeds 2^62 bytes.
std::optional<uint64_t> tensor_bytes(std::span<const int64_t> shape, DType dtype);

}  // namespace xs::detail
