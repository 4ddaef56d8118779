#pragma once
// Running f32/f64/bf16 kernels through one float code path: bf16 operands are widened to f32,
// computed, and rounded back on store (as the fused loops do).
//
//   with_float(out.type->dtype, ins, out, [&](const auto& in, auto* o) { kernel(in[0], o); });

#include <span>
#include <vector>

#include "xla_spawn/base/check.h"
#include "xla_spawn/runtime/kernels/kernels.h"

namespace xs::detail {

inline std::vector<float> to_float(const void* p, int64_t n) {
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<const BF16*>(p)[i].to_float();
  return out;
}

inline void from_float(const std::vector<float>& v, void* p) {
  for (size_t i = 0; i < v.size(); ++i) static_cast<BF16*>(p)[i] = BF16::from_float(v[i]);
}

template <typename F>
void with_float(DType dtype, std::span<const Arg> ins, const Arg& out, F f) {
  if (dtype == DType::kF32) {
    std::vector<const float*> in;
    for (const Arg& a : ins) in.push_back(static_cast<const float*>(a.data));
    return f(in, static_cast<float*>(out.data));
  }
  if (dtype == DType::kF64) {
    std::vector<const double*> in;
    for (const Arg& a : ins) in.push_back(static_cast<const double*>(a.data));
    return f(in, static_cast<double*>(out.data));
  }
  XS_CHECK(dtype == DType::kBF16, "gradient kernel on {} is rejected by the shape rule",
           dtype_name(dtype));
  std::vector<std::vector<float>> conv;
  std::vector<const float*> in;
  for (const Arg& a : ins) conv.push_back(to_float(a.data, numel(a.type->shape)));
  for (const auto& v : conv) in.push_back(v.data());
  std::vector<float> of(numel(out.type->shape));
  f(in, of.data());
  from_float(of, out.data);
}

}  // namespace xs::detail
