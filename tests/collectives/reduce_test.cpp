#include "xla_spawn/collectives/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace xs {
namespace {

TEST(ReduceTest, BF16AccumulatesInF32AndRoundsOnce) {
  // 256 + 1 + 1 is 258 (exact in bf16); rounding after each add would give 256 twice.
  const uint16_t a = BF16::from_float(256.0f).bits, b = BF16::from_float(1.0f).bits;
  const void* sources[] = {&a, &b, &b};
  uint16_t out = 0;
  reduce_sources(&out, nullptr, sources, 3, 1, DType::kBF16, ReduceOp::kSum, 3);
  EXPECT_EQ(BF16{out}.to_float(), 258.0f);
}

TEST(ReduceTest, IntegerMeanTruncatesTowardZero) {
  const int32_t a = -7, b = 2;
  const void* sources[] = {&a, &b};
  int32_t out = 0;
  reduce_sources(&out, nullptr, sources, 2, 1, DType::kI32, ReduceOp::kMean, 2);
  EXPECT_EQ(out, -2);  // -5 / 2
}

TEST(ReduceTest, IntegerSumWrapsInsteadOfOverflowing) {
  const int64_t a = std::numeric_limits<int64_t>::max(), b = 1;
  const void* sources[] = {&a, &b};
  int64_t out = 0;
  reduce_sources(&out, nullptr, sources, 2, 1, DType::kI64, ReduceOp::kSum, 2);
  EXPECT_EQ(out, std::numeric_limits<int64_t>::min());
}

TEST(ReduceTest, SourcesAreCombinedLeftToRightInOrdinalOrder) {
  // In f32 (1e8 + 1) - 1e8 is 0 but (-1e8 + 1) + 1e8 is 0 too: compare with each order.
  const float x0 = 1e8f, x1 = 1.0f, x2 = -1e8f;
  const void* sources[] = {&x0, &x1, &x2};
  float out = -1;
  reduce_sources(&out, nullptr, sources, 3, 1, DType::kF32, ReduceOp::kSum, 3);
  EXPECT_EQ(out, (x0 + x1) + x2);
  const void* reversed[] = {&x2, &x1, &x0};
  reduce_sources(&out, nullptr, reversed, 3, 1, DType::kF32, ReduceOp::kSum, 3);
  EXPECT_EQ(out, (x2 + x1) + x0);
}

TEST(ReduceTest, MaxAndMinOverManyBlocks) {
  std::vector<double> a(5000), b(5000), out(5000);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<double>(i % 7);
    b[i] = static_cast<double>(i % 5);
  }
  const void* sources[] = {a.data(), b.data()};
  reduce_sources(out.data(), nullptr, sources, 2, a.size(), DType::kF64, ReduceOp::kMax, 2);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(out[i], std::max(a[i], b[i])) << i;
  reduce_sources(out.data(), nullptr, sources, 2, a.size(), DType::kF64, ReduceOp::kMin, 2);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(out[i], std::min(a[i], b[i])) << i;
}

}  // namespace
}  // namespace xs

namespace xs {
namespace {

TEST(ReduceTest, StreamingStoresGiveTheSameResultAtAnyAlignment) {
  for (size_t offset : {0u, 1u, 3u}) {
    for (size_t n : {1u, 63u, 2048u, 5001u}) {
      std::vector<float> a(n + 4), b(n + 4), plain(n + 4), streamed(n + 4), copy(n + 4);
      for (size_t i = 0; i < a.size(); ++i) {
        a[i] = static_cast<float>(i);
        b[i] = 0.5f * static_cast<float>(i);
      }
      const void* sources[] = {a.data() + offset, b.data() + offset};
      reduce_sources(plain.data() + offset, nullptr, sources, 2, n, DType::kF32, ReduceOp::kSum, 2,
                     false);
      reduce_sources(streamed.data() + offset, copy.data() + offset, sources, 2, n, DType::kF32,
                     ReduceOp::kSum, 2, true);
      EXPECT_EQ(plain, streamed) << "offset " << offset << " n " << n;
      EXPECT_EQ(plain, copy) << "offset " << offset << " n " << n;
    }
  }
}

}  // namespace
}  // namespace xs

namespace xs {
namespace {

// The one-pass AVX2 kernels (used when not streaming) against the portable ones (used when
// streaming): bit for bit, with NaNs, signed zeros and ties, every op, 2..9 sources, tails.
template <class T>
void expect_kernels_agree(DType dtype) {
  const T specials[] = {T(0), -T(0), std::numeric_limits<T>::quiet_NaN(), T(1), T(-1), T(3)};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin}) {
    for (int k = 2; k <= 9; ++k) {
      const size_t n = 1000 + static_cast<size_t>(k);  // not a multiple of the vector width
      std::vector<std::vector<T>> in(static_cast<size_t>(k), std::vector<T>(n));
      std::vector<const void*> sources;
      for (int s = 0; s < k; ++s) {
        for (size_t i = 0; i < n; ++i) {
          in[s][i] = (i + s) % 5 == 0 ? specials[(i * 7 + s) % 6] : T(0.1) * T((i * 13 + s) % 17);
        }
        sources.push_back(in[s].data());
      }
      std::vector<T> fast(n), fast2(n), portable(n), portable2(n);
      reduce_sources(fast.data(), fast2.data(), sources.data(), k, n, dtype, op, k, false);
      reduce_sources(portable.data(), portable2.data(), sources.data(), k, n, dtype, op, k, true);
      ASSERT_EQ(0, std::memcmp(fast.data(), portable.data(), n * sizeof(T)))
          << dtype_name(dtype) << " " << reduce_op_name(op) << " k " << k;
      ASSERT_EQ(0, std::memcmp(fast2.data(), fast.data(), n * sizeof(T)));
    }
  }
}

// Max and min keep a NaN whichever source holds it, on both kernels (the portable one
// streams): before, a NaN survived only from the first source.
TEST(ReduceTest, MaxAndMinKeepANaNFromAnySource) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (bool streaming : {false, true}) {
    for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
      for (int holder = 0; holder < 3; ++holder) {
        std::vector<std::vector<float>> in(3, std::vector<float>(19, 1.0f));
        for (size_t i = 0; i < 19; ++i) in[static_cast<size_t>(holder)][i] = i % 2 == 0 ? nan : -5.0f + float(i);
        const void* sources[] = {in[0].data(), in[1].data(), in[2].data()};
        std::vector<float> out(19);
        reduce_sources(out.data(), nullptr, sources, 3, 19, DType::kF32, op, 3, streaming);
        for (size_t i = 0; i < 19; i += 2) {
          ASSERT_TRUE(std::isnan(out[i])) << reduce_op_name(op) << " NaN in source " << holder
                                          << " element " << i << (streaming ? " streaming" : "");
        }
        const float odd = op == ReduceOp::kMax ? std::max(1.0f, -4.0f) : std::min(1.0f, -4.0f);
        ASSERT_EQ(out[1], odd);
      }
    }
  }
}

TEST(ReduceTest, VectorKernelsMatchPortableKernelsBitForBitF32) {
  expect_kernels_agree<float>(DType::kF32);
}
TEST(ReduceTest, VectorKernelsMatchPortableKernelsBitForBitF64) {
  expect_kernels_agree<double>(DType::kF64);
}

// bf16: computed in f32, rounded once to nearest even on store (ties, NaNs of either sign,
// overflow to infinity, subnormals), by the vector kernel as by the portable one.
TEST(ReduceTest, VectorKernelsMatchPortableKernelsBitForBitBF16) {
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(), 1.0f, 0x1p-8f,
                            3e38f, -3e38f, 0x1p-130f, 1.0f + 0x1p-7f};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin}) {
    for (int k = 2; k <= 9; ++k) {
      const size_t n = 1000 + static_cast<size_t>(k);
      std::vector<std::vector<uint16_t>> in(static_cast<size_t>(k), std::vector<uint16_t>(n));
      std::vector<const void*> sources;
      for (int s = 0; s < k; ++s) {
        for (size_t i = 0; i < n; ++i) {
          const float v = (i + s) % 4 == 0 ? specials[(i * 7 + s) % 10]
                                           : 0.37f * static_cast<float>((i * 13 + s) % 23) - 3.0f;
          in[s][i] = BF16::from_float(v).bits;
        }
        sources.push_back(in[s].data());
      }
      std::vector<uint16_t> fast(n), fast2(n), portable(n), portable2(n);
      reduce_sources(fast.data(), fast2.data(), sources.data(), k, n, DType::kBF16, op, k, false);
      reduce_sources(portable.data(), portable2.data(), sources.data(), k, n, DType::kBF16, op, k,
                     true);
      ASSERT_EQ(fast, portable) << reduce_op_name(op) << " k " << k;
      ASSERT_EQ(fast2, fast);
    }
  }
}

TEST(ReduceTest, VectorKernelReducesInPlaceIntoOneOfItsSources) {
  std::vector<float> a(1003), b(1003);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 2.0f * static_cast<float>(i);
  }
  const void* sources[] = {a.data(), b.data()};
  reduce_sources(b.data(), nullptr, sources, 2, a.size(), DType::kF32, ReduceOp::kSum, 2);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(b[i], 3.0f * static_cast<float>(i)) << i;
}

}  // namespace
}  // namespace xs
