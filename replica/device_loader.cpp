#include "xla_spawn/replica/device_loader.h"

#include <algorithm>
#include <chrono>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/trace.h"

namespace xs::xm {

int64_t global_valid_samples(int64_t n_samples, int64_t global_batch, int64_t index, bool pad) {
  if (!pad) return global_batch;
  return std::clamp<int64_t>(n_samples - index * global_batch, 0, global_batch);
}

DeviceLoader::DeviceLoader(BatchLoader& host) : host_(host) {}

std::optional<DeviceBatch> DeviceLoader::next() {
  const auto start = std::chrono::steady_clock::now();
  std::optional<HostBatch> hb;
  {
    TraceScope span("data wait", "data");
    hb = host_.next();
  }
  last_wait_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!hb) return std::nullopt;
  const ShardSpec& spec = host_.sampler().spec();
  DeviceBatch b;
  b.epoch = hb->epoch;
  b.index = hb->index;
  b.n_valid = hb->n_valid;
  b.global_valid = global_valid_samples(spec.n_samples, host_.sampler().global_batch_size(),
                                        hb->index, spec.tail == TailMode::kPad);
  XS_CHECK(b.global_valid > 0, "batch {} of epoch {} has no valid sample on any ordinal", hb->index,
           hb->epoch);
  b.images = Tensor::from_vector<float>(hb->images, hb->image_shape);
  b.labels = Tensor::from_vector<int64_t>(hb->labels, {hb->batch_size});
  b.mask = Tensor::from_vector<float>(hb->mask, {hb->batch_size});
  // Data (not a constant) even when it is 0 or 1: the graph must not depend on the value.
  b.divisor = Tensor::full_data({}, static_cast<double>(b.global_valid) / spec.world_size);
  return b;
}

}  // namespace xs::xm
