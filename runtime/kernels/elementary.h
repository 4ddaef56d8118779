#pragma once
// The runtime's own f32 exp and erf: plain arithmetic a compiler vectorises, where libm's expf
// and erff are one call per element (erf alone was 15% of a GPT training step). The generated
// code (compiler/codegen.cpp) emits these formulas operation for operation, so native loops
// and the interpreter stay bit-identical; f64 keeps libm.
//
//   float y = xs::detail::exp_f32(x);   // within 1 ulp of exp, as expf is; NaN, +-inf, denormals kept
//   float e = xs::detail::erf_f32(x);   // within 7 ulp (4e-7) of erf; NaN, +-inf, -0 kept
//
// Every translation unit that includes this needs -ffp-contract=off (xs_runtime passes it on to
// its users): a fused multiply-add rounds once where the generated code rounds twice, and the
// linker keeps one copy of an inline function for all of them. The clamps and the final
// selects are written as std::min/std::max and one select per condition, and xs_runtime
// builds with -fno-trapping-math (no value changes): GCC then turns them into blends and
// vectorises a loop of exp_f32 (softmax's); with a nested ?: or trapping math it keeps a branch
// per element.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace xs::detail {

// exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in two parts (Cody and Waite),
// exp(r) by Cephes' degree-6 polynomial on |r| <= ln 2 / 2. 2^n is applied as 2^(n/2) twice,
// so results down to the smallest denormal (n = -150) come out as libm's do.
struct ExpF32 {
  static constexpr float kHi = 88.72283935546875f;  // above this expf overflows to inf
  static constexpr float kLo = -103.972084045410156f;  // below this expf is 0
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  static constexpr float kLn2Hi = 0.693359375f;  // 9 bits, so n * kLn2Hi is exact
  static constexpr float kLn2Lo = -2.12194440e-4f;
  static constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                  4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
};

inline float exp_f32(float x) {
  using E = ExpF32;
  const float c = std::min(std::max(x, E::kLo), E::kHi);  // NaN passes through
  const float t = c * E::kLog2e + E::kRound;
  const float n = t - E::kRound;
  const float r = (c - n * E::kLn2Hi) - n * E::kLn2Lo;
  float p = E::kP[0];
  for (int i = 1; i < 6; ++i) p = p * r + E::kP[i];
  const float y = p * (r * r) + r + 1.0f;
  // n sits in t's low mantissa bits; two scale factors 2^n1 * 2^n2 = 2^n, each normal.
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(E::kRound);
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const float s1 = std::bit_cast<float>((n1 + 127) << 23), s2 = std::bit_cast<float>((n2 + 127) << 23);
  float v = y * s1 * s2;
  v = x > E::kHi ? std::numeric_limits<float>::infinity() : v;
  v = x < E::kLo ? 0.0f : v;
  return v;
}

// erf(x) = x P(x^2) / Q(x^2) on x clamped to [-4, 4] (erf(4) rounds to 1 in f32): the
// rational approximation XLA's CPU and GPU backends use for f32 erf.
struct ErfF32 {
  static constexpr float kClamp = 4.0f;
  static constexpr float kP[7] = {-2.72614225801306e-10f, 2.77068142495902e-08f, -2.10102402082508e-06f,
                                  -5.69250639462346e-05f, -7.34990630326855e-04f, -2.95459980854025e-03f,
                                  -1.60960333262415e-02f};
  static constexpr float kQ[5] = {-1.45660718464996e-05f, -2.13374055278905e-04f, -1.68282697438203e-03f,
                                  -7.37332916720468e-03f, -1.42647390514189e-02f};
};

inline float erf_f32(float x) {
  using E = ErfF32;
  const float c = std::min(std::max(x, -E::kClamp), E::kClamp);  // NaN passes through
  const float c2 = c * c;
  float p = E::kP[0];
  for (int i = 1; i < 7; ++i) p = p * c2 + E::kP[i];
  float q = E::kQ[0];
  for (int i = 1; i < 5; ++i) q = q * c2 + E::kQ[i];
  const float e = c * p / q;
  return std::min(std::max(e, -1.0f), 1.0f);
}

// The kernels' exp and erf for any float compute type: the formulas above for f32, libm for f64.
template <typename T>
T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>) return exp_f32(x);
  else return std::exp(x);
}
template <typename T>
T erf_of(T x) {
  if constexpr (std::is_same_v<T, float>) return erf_f32(x);
  else return std::erf(x);
}

}  // namespace xs::detail
