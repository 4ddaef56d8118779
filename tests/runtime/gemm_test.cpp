// The runtime's f32 GEMM on both of its backends: products of at least 4 Mi multiply-adds go
// to oneDNN, smaller ones to OpenBLAS (runtime/kernels/linalg.cpp). Each is checked against a
// naive double reference for every transpose, at odd sizes on both sides of the threshold.
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/kernels/kernels.h"

namespace xs::detail {
namespace {

struct GemmCase {
  int64_t m, n, k;
};

class GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmTest, MatchesANaiveReferenceForEveryTranspose) {
  const auto [m, n, k] = GetParam();
  // Values from the index, so a transposed or shifted read gives other numbers.
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 37 % 101) - 50) / 64.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 53 % 97) - 48) / 32.0f;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    std::vector<float> c(static_cast<size_t>(m * n), NAN);
    gemm_f32(ta, tb, m, n, k, a.data(), b.data(), c.data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double want = 0, scale = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double x = ta ? a[p * m + i] : a[i * k + p], y = tb ? b[j * k + p] : b[p * n + j];
          want += x * y;
          scale += std::fabs(x * y);
        }
        ASSERT_NEAR(c[i * n + j], want, 1e-5 * scale + 1e-6)
            << m << "x" << n << "x" << k << " ta " << ta << " tb " << tb << " at (" << i << ", " << j << ")";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BothBackends, GemmTest,
                         ::testing::Values(GemmCase{7, 5, 3},          // OpenBLAS
                                           GemmCase{128, 128, 32},     // OpenBLAS (attention)
                                           GemmCase{301, 129, 257},    // oneDNN, odd sizes
                                           GemmCase{513, 130, 64}));   // oneDNN
}  // namespace
}  // namespace xs::detail
