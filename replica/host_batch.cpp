#include "xla_spawn/replica/host_batch.h"

#include <array>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"

namespace xs {

HostBatch make_image_batch(const ImageDataset& dataset, const BatchPlan& plan, Normalization norm) {
  XS_CHECK_ARG(norm.stddev > 0.0f, "normalisation stddev {} must be positive", norm.stddev);
  const auto batch_size = static_cast<int64_t>(plan.indices.size());
  const int64_t elems = dataset.sample_elems();
  HostBatch batch;
  batch.epoch = plan.epoch;
  batch.index = plan.index;
  batch.batch_size = batch_size;
  batch.n_valid = plan.n_valid;
  batch.image_shape = {batch_size, 1, dataset.rows, dataset.cols};
  batch.images.resize(static_cast<size_t>(batch_size * elems));
  batch.labels.resize(static_cast<size_t>(batch_size));
  batch.mask.resize(static_cast<size_t>(batch_size));
  batch.sample_indices = plan.indices;

  // One lookup table per batch: 256 entries instead of a divide per pixel.
  std::array<float, 256> table{};
  for (int v = 0; v < 256; ++v) {
    table[static_cast<size_t>(v)] = (static_cast<float>(v) / 255.0f - norm.mean) / norm.stddev;
  }
  for (int64_t j = 0; j < batch_size; ++j) {
    const int64_t sample = plan.indices[static_cast<size_t>(j)];
    XS_CHECK_ARG(sample >= 0 && sample < dataset.n_samples,
                 "batch {} of epoch {}: sample index {} outside the data set of {}", plan.index,
                 plan.epoch, sample, dataset.n_samples);
    float* out = batch.images.data() + j * elems;
    for (const uint8_t pixel : dataset.pixels(sample)) *out++ = table[pixel];
    batch.labels[static_cast<size_t>(j)] = dataset.labels[static_cast<size_t>(sample)];
    batch.mask[static_cast<size_t>(j)] = j < plan.n_valid ? 1.0f : 0.0f;
  }
  return batch;
}

}  // namespace xs
