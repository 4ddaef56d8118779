#pragma once
// Naive reference implementations for the conformance test: tensors as doubles on the host,
// every op written the obvious way (loops over coordinates), independent of the runtime's
// kernels.
//
//   Host a = random_host({3, 4}, DType::kF32, rng);
//   Host r = ref_binary(a, b, [](double x, double y) { return x + y; });

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "xla_spawn/runtime/ops.h"

namespace xs::testing {

struct Host {
  Shape shape;
  DType dtype = DType::kF32;
  std::vector<double> v;
};

inline std::vector<int64_t> coords_of(int64_t flat, const Shape& shape) {
  std::vector<int64_t> c(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    c[d] = flat % shape[d];
    flat /= shape[d];
  }
  return c;
}

inline int64_t flat_of(const std::vector<int64_t>& c, const Shape& shape) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + c[d];
  return f;
}

// Value of `h` at output coordinates `c` of a broadcast to rank c.size().
inline double at_broadcast(const Host& h, const std::vector<int64_t>& c) {
  std::vector<int64_t> own(h.shape.size());
  const size_t lead = c.size() - h.shape.size();
  for (size_t d = 0; d < own.size(); ++d) own[d] = h.shape[d] == 1 ? 0 : c[lead + d];
  return h.v[flat_of(own, h.shape)];
}

// Rounds to what dtype can hold (f32/bf16 precision, integer truncation, bool).
inline double round_to(double x, DType dtype) {
  switch (dtype) {
    case DType::kF32: return static_cast<float>(x);
    case DType::kBF16: return BF16::from_float(static_cast<float>(x)).to_float();
    case DType::kF64: return x;
    case DType::kI32: return static_cast<double>(static_cast<int32_t>(x));
    case DType::kI64: return static_cast<double>(static_cast<int64_t>(x));
    case DType::kBool: return x != 0 ? 1 : 0;
  }
  return x;
}

inline Host random_host(const Shape& shape, DType dtype, std::mt19937& rng, double lo = -2, double hi = 2) {
  Host h{shape, dtype, std::vector<double>(numel(shape))};
  std::uniform_real_distribution<double> u(lo, hi);
  for (double& x : h.v) {
    x = dtype == DType::kBool ? (u(rng) > (lo + hi) / 2 ? 1 : 0)
        : (dtype == DType::kI32 || dtype == DType::kI64) ? std::floor(u(rng))
                                                         : round_to(u(rng), dtype);
  }
  return h;
}

inline Tensor to_tensor(const Host& h) { return Tensor::from_vector<double>(h.v, h.shape, h.dtype); }

inline Host from_tensor(const Tensor& t) { return Host{t.shape(), t.dtype(), t.to_vector<double>()}; }

inline Host ref_map(const std::vector<const Host*>& ins, DType out_dtype,
                    const std::function<double(const std::vector<double>&)>& f) {
  Shape shape = ins[0]->shape;
  for (const Host* h : ins) shape = broadcast_shapes(shape, h->shape, "ref");
  Host out{shape, out_dtype, std::vector<double>(numel(shape))};
  std::vector<double> args(ins.size());
  for (int64_t i = 0; i < numel(shape); ++i) {
    const std::vector<int64_t> c = coords_of(i, shape);
    for (size_t k = 0; k < ins.size(); ++k) args[k] = at_broadcast(*ins[k], c);
    out.v[i] = round_to(f(args), out_dtype);
  }
  return out;
}

}  // namespace xs::testing
