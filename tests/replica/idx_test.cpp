#include "xla_spawn/replica/idx.h"

#include <algorithm>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/fashion_mnist.h"
#include "tests/replica/idx_files.h"
#include "tests/replica/temp_dir.h"

namespace xs {
namespace {

using testing::gzip;
using ::testing::HasSubstr;
using testing::idx_bytes;

// The message of the InvalidArgument that read_idx(path) throws ("" when it does not throw).
std::string idx_error(const std::string& path) {
  try {
    read_idx(path);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

std::vector<uint8_t> pixels(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

TEST(IdxReader, ReadsTheInstalledFashionMnistTestFiles) {
  const IdxArray images =
      read_idx(std::string(kDefaultFashionMnistDir) + "/t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(images.type, IdxType::kU8);
  EXPECT_EQ(images.dims, (std::vector<uint64_t>{10000, 28, 28}));
  EXPECT_EQ(images.data().size(), 10000u * 28 * 28);
  const IdxArray labels =
      read_idx(std::string(kDefaultFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(labels.dims, (std::vector<uint64_t>{10000}));
  EXPECT_EQ(*std::max_element(labels.data().begin(), labels.data().end()), 9);
}

TEST(IdxReader, RawAndGzipFilesGiveTheSameArray) {
  testing::TempDir dir;
  const auto raw = idx_bytes(0x08, {3, 4, 5}, pixels(60));
  const IdxArray a = read_idx(dir.write("a.idx", raw));
  const IdxArray b = read_idx(dir.write("a.idx.gz", gzip(raw)));
  EXPECT_EQ(a.dims, (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(a.dims, b.dims);
  EXPECT_TRUE(std::ranges::equal(a.data(), b.data()));
  EXPECT_TRUE(std::ranges::equal(a.data(), pixels(60)));
}

TEST(IdxReader, ReadsConcatenatedGzipMembers) {
  testing::TempDir dir;
  const auto raw = idx_bytes(0x08, {100}, pixels(100));
  auto first = gzip(std::vector<uint8_t>(raw.begin(), raw.begin() + 40));
  const auto second = gzip(std::vector<uint8_t>(raw.begin() + 40, raw.end()));
  first.insert(first.end(), second.begin(), second.end());
  EXPECT_TRUE(std::ranges::equal(read_idx(dir.write("cat.gz", first)).data(), pixels(100)));
}

TEST(IdxReader, KeepsMultiByteElementsBigEndian) {
  testing::TempDir dir;
  const IdxArray a =
      read_idx(dir.write("i32.idx", idx_bytes(0x0C, {2}, {0, 0, 1, 2, 0xff, 0, 0, 1})));
  EXPECT_EQ(a.type, IdxType::kI32);
  EXPECT_EQ(a.n_elems(), 2u);
  EXPECT_EQ(a.data()[3], 2);
}

TEST(IdxReader, RejectsWrongMagicNamingTheFileAndBytes) {
  testing::TempDir dir;
  auto raw = idx_bytes(0x08, {4}, pixels(4));
  raw[1] = 0x01;
  const std::string path = dir.write("magic.idx", raw);
  const std::string error = idx_error(path);
  EXPECT_THAT(error, HasSubstr(path));
  EXPECT_THAT(error, HasSubstr("bad magic 00 01 08 01"));
}

TEST(IdxReader, RejectsUnknownElementType) {
  testing::TempDir dir;
  EXPECT_THAT(idx_error(dir.write("t.idx", idx_bytes(0x07, {4}, pixels(4)))),
              HasSubstr("unknown element type byte 0x07"));
}

TEST(IdxReader, RejectsRankZeroAndRankAboveTheLimit) {
  testing::TempDir dir;
  EXPECT_THAT(idx_error(dir.write("r0.idx", idx_bytes(0x08, {}, {1}))), HasSubstr("rank 0"));
  const std::vector<uint32_t> nine(9, 1);
  EXPECT_THAT(idx_error(dir.write("r9.idx", idx_bytes(0x08, nine, {1}))), HasSubstr("rank 9"));
}

TEST(IdxReader, RejectsTruncatedDataWithBothSizes) {
  testing::TempDir dir;
  auto raw = idx_bytes(0x08, {10, 28, 28}, pixels(7840));
  raw.resize(raw.size() - 100);
  const std::string error = idx_error(dir.write("cut.idx.gz", gzip(raw)));
  EXPECT_THAT(error, HasSubstr("dims 10x28x28 of u8 need 7840 data bytes but the file has 7740"));
  EXPECT_THAT(error, HasSubstr("truncated"));
}

TEST(IdxReader, RejectsTrailingBytes) {
  testing::TempDir dir;
  auto raw = idx_bytes(0x08, {4}, pixels(6));
  EXPECT_THAT(idx_error(dir.write("long.idx", raw)), HasSubstr("trailing bytes"));
}

TEST(IdxReader, RejectsTruncatedHeader) {
  testing::TempDir dir;
  auto raw = idx_bytes(0x08, {4, 4, 4}, {});
  raw.resize(9);
  EXPECT_THAT(idx_error(dir.write("hdr.idx", raw)),
              HasSubstr("too short for the header of rank 3"));
  EXPECT_THAT(idx_error(dir.write("tiny.idx", {0, 0})), HasSubstr("2 bytes, too short"));
  EXPECT_THAT(idx_error(dir.write("empty.idx", {})), HasSubstr("0 bytes, too short"));
}

TEST(IdxReader, RejectsDimsWhoseProductOverflows) {
  testing::TempDir dir;
  const std::vector<uint32_t> huge(4, 0xffffffffu);
  EXPECT_THAT(idx_error(dir.write("big.idx", idx_bytes(0x0E, huge, {}))), HasSubstr("exceed the"));
}

TEST(IdxReader, RejectsTruncatedGzip) {
  testing::TempDir dir;
  auto gz = gzip(idx_bytes(0x08, {1000}, pixels(1000)));
  gz.resize(gz.size() / 2);
  EXPECT_THAT(idx_error(dir.write("half.gz", gz)), HasSubstr("truncated"));
}

TEST(IdxReader, RejectsCorruptGzipData) {
  testing::TempDir dir;
  auto gz = gzip(idx_bytes(0x08, {1000}, pixels(1000)));
  for (size_t i = 12; i < gz.size() - 8; i += 3) gz[i] ^= 0x5a;
  EXPECT_THAT(idx_error(dir.write("bad.gz", gz)), HasSubstr("corrupt gzip data"));
}

TEST(IdxReader, RejectsGarbage) {
  testing::TempDir dir;
  std::vector<uint8_t> garbage(4096);
  uint32_t x = 12345;
  for (auto& b : garbage) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  garbage[0] = 0x42;
  EXPECT_THAT(idx_error(dir.write("garbage.bin", garbage)), HasSubstr("bad magic 42"));
}

TEST(IdxReader, RejectsADeclaredSizeAboveTheLimit) {
  testing::TempDir dir;
  const std::string path =
      dir.write("big.gz", gzip(idx_bytes(0x08, {1 << 20}, std::vector<uint8_t>(1 << 20, 0))));
  try {
    read_idx(path, 4096);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("dims 1048576 of u8 exceed the 4096-byte limit"));
  }
}

// A gzip bomb behind a small header: only the declared size (+1 byte) is ever inflated.
TEST(IdxReader, InflatesNoMoreThanTheHeaderDeclares) {
  testing::TempDir dir;
  const std::string path =
      dir.write("bomb.gz", gzip(idx_bytes(0x08, {16}, std::vector<uint8_t>(8 << 20, 0))));
  EXPECT_THAT(idx_error(path), HasSubstr("need 16 data bytes but the file has 17 after the 8-byte "
                                         "header (trailing bytes)"));
}

TEST(IdxReader, MissingFileIsAnIoErrorNamingThePath) {
  try {
    read_idx("/nonexistent/dir/x.idx");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("/nonexistent/dir/x.idx"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("No such file"));
  }
}

}  // namespace
}  // namespace xs
