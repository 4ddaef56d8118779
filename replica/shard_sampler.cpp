#include "xla_spawn/replica/shard_sampler.h"

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/context.h"

namespace xs {

std::string_view tail_mode_name(TailMode tail) {
  switch (tail) {
    case TailMode::kDrop:
      return "drop";
    case TailMode::kPad:
      return "pad";
  }
  return "?";
}

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  XS_CHECK_ARG(n >= 0 && epoch >= 0, "seeded_permutation: n {} and epoch {} must be >= 0", n,
               epoch);
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  // Distinct epochs (and seeds) start far apart in splitmix64's sequence.
  SplitMix64 rng(splitmix64_finalize(
      seed ^ splitmix64_finalize(static_cast<uint64_t>(epoch) * kSplitMix64Increment + 1)));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

ShardSampler::ShardSampler(const ShardSpec& spec) : spec_(spec) {
  XS_CHECK_ARG(spec.world_size >= 1 && spec.world_size <= kMaxWorldSize,
               "sampler: world size {} must be in 1..{}", spec.world_size, kMaxWorldSize);
  XS_CHECK_ARG(spec.ordinal >= 0 && spec.ordinal < spec.world_size,
               "sampler: ordinal {} must be in 0..{}", spec.ordinal, spec.world_size - 1);
  XS_CHECK_ARG(spec.batch_size >= 1 && spec.batch_size <= (int64_t{1} << 32),
               "sampler: batch size {} must be in 1..2^32", spec.batch_size);
  XS_CHECK_ARG(spec.n_samples >= 1, "sampler: the data set has {} samples; need at least 1",
               spec.n_samples);
  const int64_t global = global_batch_size();
  batches_per_epoch_ = spec.tail == TailMode::kDrop ? spec.n_samples / global
                                                    : (spec.n_samples + global - 1) / global;
  XS_CHECK_ARG(batches_per_epoch_ >= 1,
               "sampler: {} samples < world size {} x batch size {} = {}: tail mode 'drop' "
               "would leave no batch; use 'pad' or a smaller batch",
               spec.n_samples, spec.world_size, spec.batch_size, global);
}

std::vector<int64_t> ShardSampler::epoch_order(int64_t epoch) const {
  XS_CHECK_ARG(epoch >= 0, "sampler: epoch {} must be >= 0", epoch);
  if (spec_.shuffle) return seeded_permutation(spec_.n_samples, spec_.seed, epoch);
  std::vector<int64_t> order(static_cast<size_t>(spec_.n_samples));
  for (int64_t i = 0; i < spec_.n_samples; ++i) order[static_cast<size_t>(i)] = i;
  return order;
}

BatchPlan ShardSampler::batch(std::span<const int64_t> order, int64_t epoch, int64_t index) const {
  XS_CHECK_ARG(static_cast<int64_t>(order.size()) == spec_.n_samples,
               "sampler: order has {} entries, the data set {}", order.size(), spec_.n_samples);
  XS_CHECK_ARG(index >= 0 && index < batches_per_epoch_, "sampler: batch {} not in 0..{}", index,
               batches_per_epoch_ - 1);
  BatchPlan plan;
  plan.epoch = epoch;
  plan.index = index;
  plan.indices.resize(static_cast<size_t>(spec_.batch_size));
  const int64_t n = spec_.n_samples;
  for (int64_t j = 0; j < spec_.batch_size; ++j) {
    // Global position of slot j: step index's block, strided by ordinal (see the header).
    const int64_t position = (index * spec_.batch_size + j) * spec_.world_size + spec_.ordinal;
    // Positions past the end exist only in pad mode; they repeat samples from the start.
    plan.indices[static_cast<size_t>(j)] = order[static_cast<size_t>(position % n)];
    // Valid slots form a prefix: position grows with j.
    if (position < n) plan.n_valid = j + 1;
  }
  return plan;
}

std::vector<BatchPlan> ShardSampler::epoch_plan(int64_t epoch) const {
  const std::vector<int64_t> order = epoch_order(epoch);
  std::vector<BatchPlan> plans;
  plans.reserve(static_cast<size_t>(batches_per_epoch_));
  for (int64_t b = 0; b < batches_per_epoch_; ++b) plans.push_back(batch(order, epoch, b));
  return plans;
}

}  // namespace xs
