// The runtime's f32 GEMM on both of its backends: products of at least 4 Mi multiply-adds go
// to oneDNN, smaller ones to OpenBLAS (runtime/kernels/linalg.cpp). Each is checked against a
// naive double reference for every transpose, at odd sizes on both sides of the threshold.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <thread>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
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

namespace xs::detail {
namespace {

// The causal structure bits of a batched matmul (kernels.h, kMatmulCausalOut...) against the
// plain product of the same operands (to rounding; the same terms in the same order give the
// same bits on OpenBLAS's kernels): up to each row block's last row (kMatmulCausalOut, zero
// after it) or everywhere (a triangular a), for every transpose, f32 and f64, at T of one
// partial block, of several with a partial last one, and of whole blocks.
template <typename T>
void check_causal_structure(int64_t structure, int64_t t, int64_t other, bool ta, bool tb) {
  const DType dtype = std::is_same_v<T, float> ? DType::kF32 : DType::kF64;
  const int64_t batch = 3;
  // As multiplied: a [t x k], b [k x n]; CausalOut: k = other, n = t; triangular a: k = t, n = other.
  const bool out = structure == kMatmulCausalOut;
  const int64_t m = t, k = out ? other : t, n = out ? t : other;
  std::vector<T> a(static_cast<size_t>(batch * m * k)), b(static_cast<size_t>(batch * k * n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<T>(static_cast<int64_t>(i * 37 % 101) - 50) / 64;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<T>(static_cast<int64_t>(i * 53 % 97) - 48) / 32;
  if (!out) {  // zero a's other triangle, as a causal softmax leaves it
    for (int64_t s = 0; s < batch; ++s)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t p = 0; p < k; ++p) {
          const bool zero = structure == kMatmulLowerA ? p > i : p < i;
          if (zero) a[s * m * k + (ta ? p * m + i : i * k + p)] = 0;
        }
  }
  const ValueType at{ta ? Shape{batch, k, m} : Shape{batch, m, k}, dtype};
  const ValueType bt{tb ? Shape{batch, n, k} : Shape{batch, k, n}, dtype};
  const ValueType ct{{batch, m, n}, dtype};
  std::vector<T> full(static_cast<size_t>(batch * m * n)), got(full.size(), static_cast<T>(NAN));
  Attrs plain;
  plain.flag = (ta ? 1 : 0) | (tb ? 2 : 0);
  Attrs marked = plain;
  marked.flag |= structure;
  matmul_kernel(plain, {a.data(), &at}, {b.data(), &bt}, {full.data(), &ct});
  matmul_kernel(marked, {a.data(), &at}, {b.data(), &bt}, {got.data(), &ct});
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const size_t e = static_cast<size_t>((s * m + i) * n + j);
        // A causal output's row block computes up to its last row and zeroes what lies after.
        const int64_t block_end = std::min(t, (i / kCausalBlock + 1) * kCausalBlock);
        const T want = out && j >= block_end ? T{0} : full[e];
        const T tolerance = (std::is_same_v<T, float> ? T(1e-5) : T(1e-12)) * (1 + std::abs(want));
        ASSERT_NEAR(got[e], want, tolerance) << "structure " << structure << " t " << t << " ta " << ta << " tb " << tb
                                << " at (" << s << ", " << i << ", " << j << ")";
      }
}

TEST(CausalGemm, EachStructureGivesThePlainProductWhereItIsRead) {
  for (int64_t structure : {kMatmulCausalOut, kMatmulLowerA, kMatmulUpperA})
    for (int64_t t : {int64_t{1}, int64_t{7}, kCausalBlock, int64_t{70}, 2 * kCausalBlock})
      for (int tr = 0; tr < 4; ++tr) {
        check_causal_structure<float>(structure, t, 5, tr & 1, tr & 2);
        check_causal_structure<double>(structure, t, 9, tr & 1, tr & 2);
      }
}

// The f32 causal products the compiler prepares on oneDNN (one primitive per row block over the
// batch, operands as strided views) against the BLAS's plain product: within f32 rounding where
// they are read, zero after each row block of a causal output; a batch-broadcast b too.
TEST(CausalGemm, TheOnednnFormGivesThePlainProductWhereItIsRead) {
  for (int64_t structure : {kMatmulCausalOut, kMatmulLowerA, kMatmulUpperA})
    for (int64_t t : {int64_t{7}, int64_t{70}, 2 * kCausalBlock})
      for (int tr = 0; tr < 4; ++tr)
        for (bool broadcast_b : {false, true}) {
          const bool ta = tr & 1, tb = tr & 2, out = structure == kMatmulCausalOut;
          const int64_t batch = 3, m = t, k = out ? 5 : t, n = out ? t : 6;
          std::vector<float> a(static_cast<size_t>(batch * m * k)), b(static_cast<size_t>((broadcast_b ? 1 : batch) * k * n));
          for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int64_t>(i * 37 % 101) - 50) / 64;
          for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int64_t>(i * 53 % 97) - 48) / 32;
          if (!out)
            for (int64_t s = 0; s < batch; ++s)
              for (int64_t i = 0; i < m; ++i)
                for (int64_t p = 0; p < k; ++p)
                  if (structure == kMatmulLowerA ? p > i : p < i) a[s * m * k + (ta ? p * m + i : i * k + p)] = 0;
          const ValueType at{ta ? Shape{batch, k, m} : Shape{batch, m, k}, DType::kF32};
          const Shape b_mat = tb ? Shape{n, k} : Shape{k, n};
          Shape b_shape = b_mat;
          if (!broadcast_b) b_shape.insert(b_shape.begin(), batch);
          const ValueType bt{b_shape, DType::kF32}, ct{{batch, m, n}, DType::kF32};
          Attrs attrs;
          attrs.flag = (ta ? 1 : 0) | (tb ? 2 : 0);
          std::vector<float> full(static_cast<size_t>(batch * m * n)), got(full.size(), NAN);
          matmul_kernel(attrs, {a.data(), &at}, {b.data(), &bt}, {full.data(), &ct});
          attrs.flag |= structure;
          const std::vector<ValueType> ins = {at, bt};
          const auto prepared = prepare_op_kernel(Op::kMatmul, attrs, ins, ct);
          ASSERT_NE(prepared, nullptr) << "structure " << structure << " t " << t;
          const std::vector<Arg> args = {{a.data(), &at}, {b.data(), &bt}};
          prepared->run(args, {got.data(), &ct});
          for (int64_t s = 0; s < batch; ++s)
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                const size_t e = static_cast<size_t>((s * m + i) * n + j);
                const int64_t block_end = std::min(t, (i / kCausalBlock + 1) * kCausalBlock);
                if (out && j >= block_end) {
                  ASSERT_EQ(got[e], 0.0f) << "t " << t << " at (" << s << ", " << i << ", " << j << ")";
                } else if (!out || j <= i) {
                  ASSERT_NEAR(got[e], full[e], 1e-4 * (1 + std::fabs(full[e])))
                      << "structure " << structure << " t " << t << " ta " << ta << " tb " << tb << " broadcast "
                      << broadcast_b << " at (" << s << ", " << i << ", " << j << ")";
                }
              }
        }
}

TEST(CausalGemm, AStructureOnANonSquareProductIsAnInternalError) {
  std::vector<float> a(6 * 4), b(4 * 6), c(36);
  const ValueType at{{6, 4}, DType::kF32}, bt{{4, 6}, DType::kF32}, ct{{6, 6}, DType::kF32};
  Attrs lower;
  lower.flag = kMatmulLowerA;  // a is 6 x 4: no diagonal to be zero above
  EXPECT_THROW(matmul_kernel(lower, {a.data(), &at}, {b.data(), &bt}, {c.data(), &ct}), InternalError);
}

}  // namespace
}  // namespace xs::detail
