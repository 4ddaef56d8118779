// The runtime's own f32 exp and erf (kernels/elementary.h) against libm in double, over a
// sweep of every float bit pattern in steps, and at the edges; and the fixed-order row sums
// and maxima (kernels/row_sum.h).
#include "xla_spawn/runtime/kernels/elementary.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "xla_spawn/runtime/kernels/row_sum.h"

namespace xs::detail {
namespace {

// Distance in units in the last place; 0 for two NaNs.
int64_t ulps(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return 0;
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<int64_t>::max();
  auto key = [](float f) {
    const int32_t i = std::bit_cast<int32_t>(f);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};  // monotonic in f; -0 and +0 meet
  };
  return std::abs(key(a) - key(b));
}

// Every `step`-th bit pattern: all signs, exponents (denormals included) and mantissa regions.
template <typename Fn>
int64_t worst_ulps(uint32_t step, float min_magnitude, Fn&& check) {
  int64_t worst = 0;
  for (uint64_t u = 0; u <= 0xffffffffu; u += step) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(u));
    if (std::isnan(x) || std::fabs(x) < min_magnitude) continue;
    worst = std::max(worst, check(x));
  }
  return worst;
}

TEST(ExpF32, IsWithinOneUlpOfTheExactValueAcrossTheFloats) {
  const int64_t worst = worst_ulps(997, 0.0f, [](float x) {
    return ulps(exp_f32(x), static_cast<float>(std::exp(static_cast<double>(x))));
  });
  EXPECT_LE(worst, 1);
}

TEST(ErfF32, IsWithinSevenUlpOfTheExactValueAcrossTheFloats) {
  // Below 1e-30 erf(x) is about 1.128 x; a denormal x keeps fewer bits through x * P / Q
  // (3e-4 relative at 1e-40), as any product of a denormal does.
  const int64_t worst = worst_ulps(997, 1e-30f, [](float x) {
    return ulps(erf_f32(x), static_cast<float>(std::erf(static_cast<double>(x))));
  });
  EXPECT_LE(worst, 7);
  EXPECT_NEAR(erf_f32(1e-40f), static_cast<float>(std::erf(1e-40)), 1e-3 * 1.13e-40);
  EXPECT_LE(ulps(erf_f32(1e-30f), static_cast<float>(std::erf(1e-30))), 7);
}

TEST(ExpF32, KeepsInfinitiesNanZeroAndDenormalResults) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_f32(kInf), kInf);
  EXPECT_EQ(exp_f32(-kInf), 0.0f);
  EXPECT_TRUE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-0.0f), 1.0f);
  EXPECT_EQ(exp_f32(88.8f), kInf);    // past the largest finite result
  EXPECT_EQ(exp_f32(-104.0f), 0.0f);  // past the smallest denormal
  for (float x : {-87.5f, -95.0f, -100.0f, -103.9f}) {  // denormal results
    EXPECT_LE(ulps(exp_f32(x), static_cast<float>(std::exp(static_cast<double>(x)))), 1) << x;
    EXPECT_GT(exp_f32(x), 0.0f) << x;
  }
}

TEST(ErfF32, KeepsInfinitiesNanAndTheSignOfZero) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(erf_f32(kInf), 1.0f);
  EXPECT_EQ(erf_f32(-kInf), -1.0f);
  EXPECT_TRUE(std::isnan(erf_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(erf_f32(0.0f), 0.0f);
  EXPECT_FALSE(std::signbit(erf_f32(0.0f)));
  EXPECT_TRUE(std::signbit(erf_f32(-0.0f)));
  for (float x : {4.0f, 5.0f, 1e30f}) {
    EXPECT_EQ(erf_f32(x), 1.0f) << x;
    EXPECT_EQ(erf_f32(-x), -1.0f) << x;
  }
}

TEST(RowSum, AddsLanesInAnOrderThatDependsOnlyOnTheLength) {
  // Values whose sum depends on the order: 1e16 and -1e16 cancel, the ones between them do
  // not survive an index-order sum. Lane order puts element j in lane j % 16.
  for (int64_t n : {0, 1, 7, 16, 17, 33, 100}) {
    std::vector<double> x(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) x[j] = j % 3 == 0 ? 1e16 : j % 3 == 1 ? 1.0 : -1e16;
    double lane[kSumLanes] = {};
    for (int64_t j = 0; j < n; ++j) lane[j % kSumLanes] += x[j];
    double expected = 0;
    for (double v : lane) expected += v;
    EXPECT_EQ(row_sum(n, [&](int64_t j) { return x[j]; }), expected) << n;
  }
}

TEST(RowMax, FindsTheLargestWhereverItIs) {
  for (int64_t n : {1, 2, 15, 16, 17, 40}) {
    for (int64_t at = 0; at < n; ++at) {
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) x[j] = -static_cast<float>((j * 7) % 11);
      x[at] = 3.5f;
      EXPECT_EQ(row_max(x.data(), n), 3.5f) << n << " " << at;
    }
  }
}

}  // namespace
}  // namespace xs::detail
