#pragma once
// Running f32/f64/bf16 kernels through one float code path: bf16 operands are widened to f32,
// computed, and rounded back on store (as the fused loops do).
//
//   with_float(out.type->dtype, ins, out, [&](const auto& in, auto* o) { kernel(in[0], o); });

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "xla_spawn/base/check.h"
#include "xla_spawn/runtime/kernels/kernels.h"

namespace xs::detail {

// The f32 copies the bf16 paths compute on, per thread and reused: grown to the largest size
// asked, never shrunk. A fresh std::vector per call zero-filled (and, past glibc's mmap
// threshold, page-faulted) every copy on every step: with the CNN's bf16 pooling that was a
// tenth of the step.
inline float* f32_scratch(size_t slot, int64_t n) {
  struct Buffer {
    std::unique_ptr<float[]> data;
    int64_t size = 0;
  };
  thread_local std::vector<Buffer> buffers;
  if (buffers.size() <= slot) buffers.resize(slot + 1);
  Buffer& b = buffers[slot];
  if (b.size < n) {
    b.data.reset(new float[static_cast<size_t>(n)]);  // not zeroed: callers write what they read
    b.size = n;
  }
  return b.data.get();
}

// `n` bf16 values at `p` widened into scratch slot `slot`.
inline float* to_float(const void* p, int64_t n, size_t slot) {
  float* out = f32_scratch(slot, n);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<const BF16*>(p)[i].to_float();
  return out;
}

// `n` floats rounded (to nearest even) into bf16 at `p`.
inline void from_float(const float* v, int64_t n, void* p) {
  for (int64_t i = 0; i < n; ++i) static_cast<BF16*>(p)[i] = BF16::from_float(v[i]);
}

// `writes_all`: the kernel writes every output element, so its bf16 path skips zeroing the copy.
template <typename F>
void with_float(DType dtype, std::span<const Arg> ins, const Arg& out, F f,
                bool writes_all = false) {
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
  std::vector<const float*> in;
  for (size_t k = 0; k < ins.size(); ++k)
    in.push_back(to_float(ins[k].data, numel(ins[k].type->shape), k));
  // Zeroed unless `writes_all`: gradient kernels (scatters, col2im) accumulate into it.
  const int64_t n_out = numel(out.type->shape);
  float* of = f32_scratch(ins.size(), n_out);
  if (!writes_all) std::fill(of, of + n_out, 0.0f);
  f(in, of);
  from_float(of, n_out, out.data);
}

}  // namespace xs::detail
