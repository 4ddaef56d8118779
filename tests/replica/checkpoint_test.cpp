#include "xla_spawn/replica/checkpoint.h"

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include "xla_spawn/base/error.h"
#include "tests/replica/temp_dir.h"

namespace xs {
namespace {

using ::testing::HasSubstr;

// A tensor whose bytes derive from (seed, index), so a misplaced byte is caught.
HostTensor make_tensor(std::string name, DType dtype, std::vector<int64_t> shape, uint8_t seed) {
  HostTensor t{std::move(name), dtype, std::move(shape), {}};
  t.bytes.resize(static_cast<size_t>(t.n_elems()) * dtype_size(dtype));
  for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<uint8_t>(seed + i * 31);
  return t;
}

std::vector<HostTensor> sample_tensors() {
  return {make_tensor("fc1.weight", DType::kF32, {16, 8}, 1),
          make_tensor("fc1.bias", DType::kF32, {16}, 2)};
}

const CheckpointMetadata kMeta{
    {"epoch", int64_t{3}}, {"step", int64_t{-7}}, {"model", std::string("mlp")}};

std::string load_error(const std::string& path) {
  try {
    load_checkpoint(path);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

void put_le(std::vector<uint8_t>& bytes, size_t at, uint64_t value, int n_bytes) {
  for (int i = 0; i < n_bytes; ++i)
    bytes[at + static_cast<size_t>(i)] = static_cast<uint8_t>(value >> (8 * i));
}

// Recomputes the trailing CRC-32, for crafted files that must get past the checksum.
void reseal(std::vector<uint8_t>& bytes) {
  const uLong crc = crc32_z(crc32_z(0L, Z_NULL, 0), bytes.data(), bytes.size() - 4);
  put_le(bytes, bytes.size() - 4, crc, 4);
}

TEST(Checkpoint, RoundTripIsBitExactForEveryDtypeAndShape) {
  testing::TempDir dir;
  std::vector<HostTensor> tensors;
  for (int d = 0; d < kNumDTypes; ++d) {
    const auto dtype = static_cast<DType>(d);
    tensors.push_back(make_tensor(fmt::format("t.{}", dtype_name(dtype)), dtype, {3, 5, 7},
                                  static_cast<uint8_t>(d)));
  }
  tensors.push_back(make_tensor("scalar", DType::kF64, {}, 9));
  tensors.push_back(make_tensor("empty", DType::kI64, {4, 0}, 9));
  HostTensor nan = make_tensor("nan", DType::kF32, {2}, 0);
  const uint32_t payload = 0x7fa12345u;  // a signalling-bit NaN with a payload: must survive
  std::memcpy(nan.bytes.data(), &payload, 4);
  tensors.push_back(nan);
  const std::string path = dir.path("ckpt.xsckpt");
  save_checkpoint(path, tensors, kMeta);

  const Checkpoint loaded = load_checkpoint(path);
  ASSERT_EQ(loaded.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(loaded.tensors[i].name, tensors[i].name);
    EXPECT_EQ(loaded.tensors[i].dtype, tensors[i].dtype);
    EXPECT_EQ(loaded.tensors[i].shape, tensors[i].shape);
    EXPECT_EQ(loaded.tensors[i].bytes, tensors[i].bytes) << tensors[i].name;
  }
  EXPECT_EQ(loaded.metadata, kMeta);
  EXPECT_EQ(loaded.meta_int("step"), -7);
  EXPECT_EQ(loaded.meta_string("model"), "mlp");
  EXPECT_EQ(loaded.tensor("nan").bytes, nan.bytes);
}

TEST(Checkpoint, FileIsOwnerOnlyAndNoTemporaryRemains) {
  testing::TempDir dir;
  const std::string path = dir.path("ckpt.xsckpt");
  save_checkpoint(path, sample_tensors(), kMeta);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt.xsckpt"});
}

TEST(Checkpoint, SavingAgainReplacesTheFile) {
  testing::TempDir dir;
  const std::string path = dir.path("ckpt.xsckpt");
  save_checkpoint(path, sample_tensors(), kMeta);
  save_checkpoint(path, {make_tensor("other", DType::kBF16, {3}, 4)}, {{"epoch", int64_t{4}}});
  const Checkpoint loaded = load_checkpoint(path);
  ASSERT_EQ(loaded.tensors.size(), 1u);
  EXPECT_EQ(loaded.meta_int("epoch"), 4);
}

TEST(Checkpoint, SerializedImageEqualsTheSavedFile) {
  testing::TempDir dir;
  const std::string path = dir.path("ckpt.xsckpt");
  const auto tensors = sample_tensors();
  save_checkpoint(path, tensors, kMeta);
  std::vector<TensorRef> refs;
  for (const auto& t : tensors) refs.push_back(t.ref());
  EXPECT_EQ(testing::TempDir::read(path), serialize_checkpoint(refs, kMeta));
}

TEST(Checkpoint, TruncatedFilesAreRejectedAsTruncated) {
  testing::TempDir dir;
  const std::string good = dir.path("good.xsckpt");
  save_checkpoint(good, sample_tensors(), kMeta);
  const auto bytes = testing::TempDir::read(good);
  for (size_t keep :
       {size_t{0}, size_t{10}, size_t{43}, size_t{100}, bytes.size() / 2, bytes.size() - 1}) {
    const std::string path = dir.write(
        "cut.xsckpt", std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(keep)));
    const std::string error = load_error(path);
    EXPECT_THAT(error, HasSubstr(path)) << keep;
    EXPECT_THAT(error, HasSubstr("truncated")) << keep;
  }
  EXPECT_THAT(
      load_error(dir.write("cut.xsckpt", std::vector<uint8_t>(bytes.begin(), bytes.end() - 1))),
      HasSubstr(fmt::format("the header says the file is {} bytes but it has {}", bytes.size(),
                            bytes.size() - 1)));
}

// Flip one byte at every position: each file is rejected, and past the fields checked before
// the checksum (magic, version, size) the checksum is what catches it.
TEST(Checkpoint, EveryFlippedByteIsRejected) {
  testing::TempDir dir;
  const std::string good = dir.path("good.xsckpt");
  save_checkpoint(good, sample_tensors(), kMeta);
  const auto bytes = testing::TempDir::read(good);
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::vector<uint8_t> bad = bytes;
    bad[i] ^= 0x10;
    std::string error;
    try {
      parse_checkpoint(bad, "flipped");
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
    const char* expected = i < 8                 ? "bad magic"
                           : i < 12              ? "format version"
                           : (i >= 16 && i < 24) ? "the header says the file is"
                                                 : "checksum mismatch";
    ASSERT_THAT(error, HasSubstr(expected)) << "byte " << i;
  }
}

TEST(Checkpoint, WrongMagicSaysItIsNotACheckpoint) {
  testing::TempDir dir;
  std::vector<uint8_t> not_ckpt(200, 0);
  std::memcpy(not_ckpt.data(), "\x1f\x8b\x08\x00", 4);
  EXPECT_THAT(load_error(dir.write("x.gz", not_ckpt)),
              HasSubstr("bad magic 1f 8b 08 00 00 00 00 00: not an xla-spawn checkpoint"));
}

TEST(Checkpoint, NewerVersionIsRejectedNamingBothVersions) {
  testing::TempDir dir;
  const std::string good = dir.path("good.xsckpt");
  save_checkpoint(good, sample_tensors(), kMeta);
  auto bytes = testing::TempDir::read(good);
  put_le(bytes, 8, 2, 4);
  EXPECT_THAT(load_error(dir.write("v2.xsckpt", bytes)),
              HasSubstr("format version 2, this build reads version 1"));
}

// Crafted files with a valid checksum: the index itself is checked against the file.
class CraftedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<TensorRef> refs;
    for (const auto& t : tensors_) refs.push_back(t.ref());
    bytes_ = serialize_checkpoint(refs, {});
  }
  std::string error_after_reseal() {
    reseal(bytes_);
    try {
      parse_checkpoint(bytes_, "/x/ckpt.bin");
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  }
  // Index layout for these names: 40-byte header, then per tensor 4 + name + 1 + 1 + 8 x rank
  // + 8 (offset) + 8 (size).
  static constexpr size_t kW = 40;  // "w", rank 2
  static constexpr size_t kWOffset = kW + 4 + 1 + 2 + 16;
  static constexpr size_t kB = kWOffset + 16;  // "b", rank 1
  static constexpr size_t kBOffset = kB + 4 + 1 + 2 + 8;
  std::vector<HostTensor> tensors_ = {make_tensor("w", DType::kF32, {4, 4}, 1),
                                      make_tensor("b", DType::kF32, {4}, 2)};
  std::vector<uint8_t> bytes_;
};

TEST_F(CraftedCheckpoint, DataPastTheEndNamesTheTensorAndBothSizes) {
  put_le(bytes_, kBOffset, bytes_.size() - 8, 8);
  EXPECT_THAT(
      error_after_reseal(),
      HasSubstr(fmt::format(
          "checkpoint /x/ckpt.bin: tensor 1 'b': data extends to byte {} but the file has {}",
          bytes_.size() - 8 + 16, bytes_.size())));
}

TEST_F(CraftedCheckpoint, HugeOffsetDoesNotOverflow) {
  put_le(bytes_, kBOffset, ~uint64_t{0} - 4, 8);
  EXPECT_THAT(error_after_reseal(), HasSubstr("tensor 1 'b': data extends to byte beyond 2^64"));
}

TEST_F(CraftedCheckpoint, OverlappingTensorsAreRejected) {
  std::memcpy(&bytes_[kBOffset], &bytes_[kWOffset], 8);
  EXPECT_THAT(error_after_reseal(), HasSubstr("overlaps tensor"));
}

TEST_F(CraftedCheckpoint, SizeThatDisagreesWithTheShapeIsRejected) {
  put_le(bytes_, kWOffset + 8, 60, 8);
  EXPECT_THAT(error_after_reseal(),
              HasSubstr("tensor 0 'w': shape [4, 4] of f32 needs 64 bytes but the index says 60"));
}

TEST_F(CraftedCheckpoint, ImpossibleCountsAreRejectedBeforeAllocating) {
  put_le(bytes_, 32, 0xffffffffu, 4);
  EXPECT_THAT(error_after_reseal(),
              HasSubstr("4294967295 tensors and 0 metadata entries cannot fit"));
}

TEST_F(CraftedCheckpoint, NameLengthPastTheIndexIsRejected) {
  put_le(bytes_, kB, 1000, 4);
  EXPECT_THAT(error_after_reseal(), HasSubstr("tensor 1: name (1000 bytes at byte"));
}

TEST_F(CraftedCheckpoint, UnknownDtypeIsRejected) {
  bytes_[kW + 5] = 17;
  EXPECT_THAT(error_after_reseal(), HasSubstr("tensor 0 'w': dtype code 17"));
}

TEST(Checkpoint, SaveRejectsInconsistentTensorsAndKeepsTheOldFile) {
  testing::TempDir dir;
  const std::string path = dir.path("ckpt.xsckpt");
  save_checkpoint(path, sample_tensors(), kMeta);
  const auto before = testing::TempDir::read(path);
  HostTensor short_bytes = make_tensor("w", DType::kF32, {4}, 0);
  short_bytes.bytes.pop_back();
  EXPECT_THROW(save_checkpoint(path, {short_bytes}, {}), InvalidArgument);
  EXPECT_THROW(
      save_checkpoint(
          path, {make_tensor("a", DType::kF32, {1}, 0), make_tensor("a", DType::kF32, {1}, 0)}, {}),
      InvalidArgument);
  EXPECT_THROW(save_checkpoint(path, {make_tensor("", DType::kF32, {1}, 0)}, {}), InvalidArgument);
  EXPECT_EQ(testing::TempDir::read(path), before);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt.xsckpt"});
}

TEST(Checkpoint, MissingEntriesAreNamedWithWhatExists) {
  testing::TempDir dir;
  const std::string path = dir.path("ckpt.xsckpt");
  save_checkpoint(path, sample_tensors(), kMeta);
  const Checkpoint ckpt = load_checkpoint(path);
  try {
    ckpt.tensor("fc2.weight");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(std::string(e.what()),
                HasSubstr("no tensor 'fc2.weight' (it has: fc1.weight, fc1.bias)"));
  }
  EXPECT_THROW(ckpt.meta_int("model"), InvalidArgument);
  EXPECT_THROW(ckpt.meta_string("nope"), InvalidArgument);
}

TEST(Checkpoint, LoadIfExistsIsEmptyOnlyForAMissingFile) {
  testing::TempDir dir;
  EXPECT_FALSE(load_checkpoint_if_exists(dir.path("none.xsckpt")).has_value());
  EXPECT_THROW(load_checkpoint_if_exists(dir.write("bad.xsckpt", {1, 2, 3})), InvalidArgument);
}

}  // namespace
}  // namespace xs
