#pragma once
// A training batch on the host, ready to hand to the runtime: images as f32 [batch, 1, rows,
// cols], normalised, labels as i64 [batch], and a mask that is 1 for real samples and 0 for
// padding (TailMode::kPad), so the shape is the same for every batch of a run.
//
//   xs::HostBatch b = xs::make_image_batch(dataset, plan, xs::kFashionMnistNormalization);
//   // loss = sum(mask * per_sample_loss) / (global count of valid samples)

#include <cstdint>
#include <vector>

#include "xla_spawn/replica/fashion_mnist.h"
#include "xla_spawn/replica/shard_sampler.h"

namespace xs {

// pixel -> (pixel / 255 - mean) / stddev.
struct Normalization {
  float mean = 0.0f;
  float stddev = 1.0f;
};

// Mean and standard deviation of the Fashion-MNIST training pixels scaled to [0, 1]
// (computed over all 60000 images; tests/replica/fashion_mnist_test.cpp recomputes them).
inline constexpr Normalization kFashionMnistNormalization{0.2860f, 0.3530f};

struct HostBatch {
  int64_t epoch = 0;
  int64_t index = 0;                    // step number within the epoch, the same on every ordinal
  int64_t batch_size = 0;               // slots, padding included
  int64_t n_valid = 0;                  // slots [0, n_valid) are real samples
  std::vector<int64_t> image_shape;     // {batch_size, 1, rows, cols}
  std::vector<float> images;            // row-major image_shape
  std::vector<int64_t> labels;          // [batch_size]
  std::vector<float> mask;              // [batch_size]: 1 valid, 0 padding
  std::vector<int64_t> sample_indices;  // [batch_size]: positions in the data set
};

// Gathers and normalises the samples `plan` names. Throws xs::InvalidArgument when an index
// is outside the data set.
HostBatch make_image_batch(const ImageDataset& dataset, const BatchPlan& plan, Normalization norm);

}  // namespace xs
