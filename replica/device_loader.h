#pragma once
// The device side of the loader (PyTorch/XLA's MpDeviceLoader): turns this ordinal's host
// batches into materialised runtime tensors before the step is traced, so every step's graph is
// the same, and gives the loss divisor of a padded batch: the GLOBAL count of valid samples.
//
//   xs::xm::DeviceLoader loader(*host_loader);
//   loader.start_epoch(epoch);
//   while (auto b = loader.next()) loss = cross_entropy(model(b->images), b->labels, b->mask,
//   b->divisor);

#include <cstdint>
#include <optional>

#include "xla_spawn/replica/batch_loader.h"
#include "xla_spawn/runtime/tensor.h"

namespace xs::xm {

struct DeviceBatch {
  int64_t epoch = 0;
  int64_t index = 0;         // batch index within the epoch (same on every ordinal)
  int64_t n_valid = 0;       // real samples in this ordinal's batch
  int64_t global_valid = 0;  // real samples in this step over all ordinals
  Tensor images;             // f32 [B, 1, 28, 28]
  Tensor labels;             // i64 [B]
  Tensor mask;               // f32 [B]: 1 real, 0 padding
  // f32 0-d: global_valid / world_size. sum(mask * loss) / divisor is this replica's share
  // of the global mean scaled so that the MEAN all-reduce of gradients is the global gradient.
  Tensor divisor;
};

// Real samples in global step `index` of an epoch over `n_samples` with `global_batch` per step
// (valid slots are a prefix of the global order, see ShardSampler).
int64_t global_valid_samples(int64_t n_samples, int64_t global_batch, int64_t index, bool pad);

class DeviceLoader {
 public:
  explicit DeviceLoader(BatchLoader& host);
  void start_epoch(int64_t epoch, int64_t first_batch = 0) {
    host_.start_epoch(epoch, first_batch);
  }
  std::optional<DeviceBatch> next();
  int64_t batches_per_epoch() const { return host_.batches_per_epoch(); }
  // Time the last next() spent waiting for the host loader, in ms.
  double last_wait_ms() const { return last_wait_ms_; }

 private:
  BatchLoader& host_;
  double last_wait_ms_ = 0;
};

}  // namespace xs::xm
