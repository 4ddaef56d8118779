#pragma once
// The Fashion-MNIST data set as a host-side image data set: 28x28 u8 pixels and labels 0..9,
// read from the IDX files the Debian package `dataset-fashion-mnist` installs. The directory
// is the argument if non-empty, else $XLA_SPAWN_DATA_DIR, else /usr/share/datasets/fashion-mnist.
//
//   auto train = std::make_shared<const xs::ImageDataset>(xs::load_fashion_mnist("",
//   xs::Split::kTrain));
//   // train->n_samples == 60000, train->pixels(i) is 784 bytes, train->labels[i] in 0..9

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xs {

inline constexpr const char* kDataDirEnv = "XLA_SPAWN_DATA_DIR";
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

enum class Split : uint8_t { kTrain, kTest };
std::string_view split_name(Split split);

// Images with one u8 channel, kept as stored (4x smaller than f32); batches normalise them.
struct ImageDataset {
  int64_t n_samples = 0;
  int rows = 0;
  int cols = 0;
  int n_classes = 0;
  std::vector<uint8_t> images;  // [n_samples, rows, cols], row-major
  std::vector<uint8_t> labels;  // [n_samples], each < n_classes

  int64_t sample_elems() const { return int64_t{rows} * cols; }
  std::span<const uint8_t> pixels(int64_t index) const {
    return std::span<const uint8_t>(images).subspan(static_cast<size_t>(index * sample_elems()),
                                                    static_cast<size_t>(sample_elems()));
  }
};

// Builds a data set from an images IDX array file and a labels IDX file, checking that the
// images are u8 [n, rows, cols], the labels u8 [n] with every value < n_classes, and that
// the counts agree. Errors name the file and the field.
ImageDataset load_idx_image_dataset(const std::string& images_path, const std::string& labels_path,
                                    int rows, int cols, int n_classes);

// The directory load_fashion_mnist reads when given "": $XLA_SPAWN_DATA_DIR or the default.
std::string fashion_mnist_dir();

// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from `dir` ("" = fashion_mnist_dir()).
ImageDataset load_fashion_mnist(std::string_view dir, Split split);

}  // namespace xs
