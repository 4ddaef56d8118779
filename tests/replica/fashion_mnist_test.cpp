#include "xla_spawn/replica/fashion_mnist.h"

#include <array>
#include <cmath>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/host_batch.h"
#include "tests/replica/idx_files.h"
#include "tests/replica/temp_dir.h"
#include "tests/support/scoped_env.h"

namespace xs {
namespace {

using testing::gzip;
using ::testing::HasSubstr;
using testing::idx_bytes;

// Writes a tiny data set in the Fashion-MNIST file layout: n images of rows x cols, labels.
void write_split(const testing::TempDir& dir, const char* prefix, uint32_t n, uint32_t rows,
                 uint32_t cols, const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> pixels(size_t{n} * rows * cols);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i);
  dir.write(std::string(prefix) + "-images-idx3-ubyte.gz",
            gzip(idx_bytes(0x08, {n, rows, cols}, pixels)));
  dir.write(std::string(prefix) + "-labels-idx1-ubyte.gz",
            gzip(idx_bytes(0x08, {static_cast<uint32_t>(labels.size())}, labels)));
}

std::string load_error(const std::string& dir, Split split) {
  try {
    load_fashion_mnist(dir, split);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The real files, both splits: counts, shape, and the balanced classes of the data set.
TEST(FashionMnist, LoadsBothInstalledSplitsWithBalancedLabels) {
  for (const auto& [split, n] : {std::pair{Split::kTrain, 60000}, std::pair{Split::kTest, 10000}}) {
    const ImageDataset data = load_fashion_mnist(kDefaultFashionMnistDir, split);
    EXPECT_EQ(data.n_samples, n);
    EXPECT_EQ(data.rows, 28);
    EXPECT_EQ(data.cols, 28);
    EXPECT_EQ(data.images.size(), static_cast<size_t>(n) * 784);
    std::array<int, 10> per_class{};
    for (uint8_t label : data.labels) ++per_class.at(label);
    for (int count : per_class) EXPECT_EQ(count, n / 10) << split_name(split);
  }
}

// The constants in host_batch.h are what the training pixels really give.
TEST(FashionMnist, NormalisationConstantsMatchTheTrainingPixels) {
  const ImageDataset data = load_fashion_mnist("", Split::kTrain);
  double sum = 0.0;
  double sum_sq = 0.0;
  for (uint8_t p : data.images) {
    const double x = p / 255.0;
    sum += x;
    sum_sq += x * x;
  }
  const double n = static_cast<double>(data.images.size());
  const double mean = sum / n;
  EXPECT_NEAR(mean, kFashionMnistNormalization.mean, 5e-4);
  EXPECT_NEAR(std::sqrt(sum_sq / n - mean * mean), kFashionMnistNormalization.stddev, 5e-4);
}

TEST(FashionMnist, EnvironmentVariableOverridesTheDefaultDirectory) {
  testing::TempDir dir;
  write_split(dir, "t10k", 3, 28, 28, {0, 9, 4});
  testing::ScopedEnv env(kDataDirEnv, dir.path());
  EXPECT_EQ(fashion_mnist_dir(), dir.path());
  const ImageDataset data = load_fashion_mnist("", Split::kTest);
  EXPECT_EQ(data.n_samples, 3);
  EXPECT_EQ(data.labels, (std::vector<uint8_t>{0, 9, 4}));
  EXPECT_EQ(data.pixels(1)[0], static_cast<uint8_t>(784));
}

TEST(FashionMnist, ExplicitDirectoryBeatsTheEnvironment) {
  testing::ScopedEnv env(kDataDirEnv, "/nonexistent");
  EXPECT_EQ(load_fashion_mnist(kDefaultFashionMnistDir, Split::kTest).n_samples, 10000);
}

TEST(FashionMnist, MissingDirectoryNamesThePathAndTheFix) {
  const std::string error = load_error("/nonexistent/fmnist", Split::kTrain);
  EXPECT_THAT(error, HasSubstr("/nonexistent/fmnist/train-images-idx3-ubyte.gz"));
  EXPECT_THAT(error, HasSubstr(kDataDirEnv));
}

TEST(FashionMnist, RejectsImagesThatAreNot28By28) {
  testing::TempDir dir;
  write_split(dir, "t10k", 2, 32, 32, {1, 2});
  const std::string error = load_error(dir.path(), Split::kTest);
  EXPECT_THAT(error, HasSubstr("t10k-images-idx3-ubyte.gz: images are 32x32, expected 28x28"));
}

TEST(FashionMnist, RejectsImagesWithTheWrongRank) {
  testing::TempDir dir;
  write_split(dir, "t10k", 2, 28, 28, {1, 2});
  dir.write("t10k-images-idx3-ubyte.gz", gzip(idx_bytes(0x08, {1568}, std::vector<uint8_t>(1568))));
  EXPECT_THAT(load_error(dir.path(), Split::kTest),
              HasSubstr("1 dimensions (1568), expected 3 (count x 28 x 28)"));
}

TEST(FashionMnist, RejectsOutOfRangeLabelNamingItsIndex) {
  testing::TempDir dir;
  write_split(dir, "train", 3, 28, 28, {1, 2, 10});
  EXPECT_THAT(load_error(dir.path(), Split::kTrain),
              HasSubstr("train-labels-idx1-ubyte.gz: label 10 at index 2 is out of range 0..9"));
}

TEST(FashionMnist, RejectsLabelCountDifferentFromImageCount) {
  testing::TempDir dir;
  write_split(dir, "train", 3, 28, 28, {1, 2});
  EXPECT_THAT(load_error(dir.path(), Split::kTrain), HasSubstr("has 2 labels but"));
}

}  // namespace
}  // namespace xs
