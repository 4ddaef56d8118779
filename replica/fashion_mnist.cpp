#include "xla_spawn/replica/fashion_mnist.h"

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/idx.h"

namespace xs {
namespace {

void expect_u8_rank(const IdxArray& array, const std::string& path, size_t rank,
                    std::string_view layout) {
  if (array.type != IdxType::kU8) {
    throw InvalidArgument(fmt::format("idx file {}: element type {}, expected u8 ({})", path,
                                      idx_type_name(array.type), layout));
  }
  if (array.dims.size() != rank) {
    throw InvalidArgument(fmt::format("idx file {}: {} dimensions ({}), expected {} ({})", path,
                                      array.dims.size(), array.shape_string(), rank, layout));
  }
}

// Throws naming the first out-of-range label and its index.
void check_labels(std::span<const uint8_t> labels, int n_classes, const std::string& path) {
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= n_classes) {
      throw InvalidArgument(fmt::format("idx file {}: label {} at index {} is out of range 0..{}",
                                        path, labels[i], i, n_classes - 1));
    }
  }
}

// The elements without a copy of the (47 MB) buffer: drop the header in place.
std::vector<uint8_t> take_data(IdxArray& array) {
  std::vector<uint8_t> data = std::move(array.bytes);
  data.erase(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(array.data_offset));
  return data;
}

}  // namespace

std::string_view split_name(Split split) {
  switch (split) {
    case Split::kTrain:
      return "train";
    case Split::kTest:
      return "test";
  }
  return "?";
}

ImageDataset load_idx_image_dataset(const std::string& images_path, const std::string& labels_path,
                                    int rows, int cols, int n_classes) {
  IdxArray images = read_idx(images_path);
  expect_u8_rank(images, images_path, 3, fmt::format("count x {} x {}", rows, cols));
  if (images.dims[1] != static_cast<uint64_t>(rows) ||
      images.dims[2] != static_cast<uint64_t>(cols)) {
    throw InvalidArgument(fmt::format("idx file {}: images are {}x{}, expected {}x{}", images_path,
                                      images.dims[1], images.dims[2], rows, cols));
  }
  IdxArray labels = read_idx(labels_path);
  expect_u8_rank(labels, labels_path, 1, "count");
  if (labels.dims[0] != images.dims[0]) {
    throw InvalidArgument(fmt::format("idx file {} has {} labels but {} has {} images", labels_path,
                                      labels.dims[0], images_path, images.dims[0]));
  }
  check_labels(labels.data(), n_classes, labels_path);

  ImageDataset dataset;
  dataset.n_samples = static_cast<int64_t>(images.dims[0]);
  dataset.rows = rows;
  dataset.cols = cols;
  dataset.n_classes = n_classes;
  dataset.images = take_data(images);
  dataset.labels = take_data(labels);
  return dataset;
}

std::string fashion_mnist_dir() {
  return env_string(kDataDirEnv).value_or(kDefaultFashionMnistDir);
}

ImageDataset load_fashion_mnist(std::string_view dir, Split split) {
  const std::string base = dir.empty() ? fashion_mnist_dir() : std::string(dir);
  const char* prefix = split == Split::kTrain ? "train" : "t10k";
  try {
    // 28x28 pixels, 10 classes: the data set's definition (its README).
    return load_idx_image_dataset(fmt::format("{}/{}-images-idx3-ubyte.gz", base, prefix),
                                  fmt::format("{}/{}-labels-idx1-ubyte.gz", base, prefix), 28, 28,
                                  10);
  } catch (const IoError& e) {
    throw IoError(
        fmt::format("{} (Fashion-MNIST {} split; install the Debian package "
                    "dataset-fashion-mnist or set {} to the directory holding it)",
                    e.what(), split_name(split), kDataDirEnv));
  }
}

}  // namespace xs
