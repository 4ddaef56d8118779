// The runtime's f32 GEMM on both of its backends: products of at least 4 Mi multiply-adds go
// to oneDNN, smaller ones to OpenBLAS (runtime/kernels/linalg.cpp). Each is checked against a
// naive double reference for every transpose, at odd sizes on both sides of the threshold.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "xla_spawn/runtime/kernels/kernels.h"

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

int64_t threads_of_this_process() {
  return std::distance(std::filesystem::directory_iterator("/proc/self/task"), std::filesystem::directory_iterator{});
}

// oneDNN's runtime is OpenMP, whose default is a thread per core in every replica: a large
// product, from the main thread or a new one, must run on the calling thread alone.
TEST(GemmThreads, ALargeProductStartsNoThreadFromAnyCallingThread) {
  const int64_t m = 512, n = 256, k = 256;  // 32 Mi multiply-adds: oneDNN
  std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), c(m * n);
  const int64_t before = threads_of_this_process();
  gemm_f32(false, false, m, n, k, a.data(), b.data(), c.data());
  EXPECT_EQ(threads_of_this_process(), before);
  EXPECT_FLOAT_EQ(c[0], 0.5f * 0.25f * k);
  int64_t seen_inside = -1;
  std::vector<float> b_tall(m * n, 0.25f);  // the second product is (k x m)(m x n)
  std::thread other([&] {
    gemm_f32(true, false, k, n, m, a.data(), b_tall.data(), c.data());
    seen_inside = threads_of_this_process();
  });
  other.join();
  EXPECT_EQ(seen_inside, before + 1) << "the calling thread and no other";
  EXPECT_FLOAT_EQ(c[0], 0.5f * 0.25f * m);
}

INSTANTIATE_TEST_SUITE_P(BothBackends, GemmTest,
                         ::testing::Values(GemmCase{7, 5, 3},          // OpenBLAS
                                           GemmCase{128, 128, 32},     // OpenBLAS (attention)
                                           GemmCase{301, 129, 257},    // oneDNN, odd sizes
                                           GemmCase{513, 130, 64}));   // oneDNN
}  // namespace
}  // namespace xs::detail
