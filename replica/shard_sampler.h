#pragma once
// Which samples each ordinal reads, batch by batch, in each epoch. Every epoch has one global
// order (a seeded permutation, identical on all ordinals); global step b covers positions
// [b*G, (b+1)*G) of it, G = world_size * batch_size, and ordinal k takes every world_size-th
// position from k, so each sample lands on exactly one replica, and a run with N replicas
// sees the same global batches as one replica with batch N*B. All ordinals get the same batch
// count (collectives would deadlock otherwise) and every batch has batch_size slots.
//
//   xs::ShardSampler sampler({.n_samples = 60000, .batch_size = 64, .ordinal = ctx.ordinal,
//                             .world_size = ctx.world_size, .seed = 1, .tail =
//                             xs::TailMode::kPad});
//   for (const xs::BatchPlan& b : sampler.epoch_plan(epoch)) use(b.indices, b.n_valid);

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "xla_spawn/base/splitmix64.h"

namespace xs {

// How the last, partial global batch of an epoch is handled.
enum class TailMode : uint8_t {
  kDrop,  // leave it out: fewer than G samples go unseen this epoch (different ones each epoch)
  kPad,   // fill the missing slots with repeated samples flagged as padding (n_valid, mask)
};
std::string_view tail_mode_name(TailMode tail);

struct ShardSpec {
  int64_t n_samples = 0;
  int64_t batch_size = 1;  // per replica
  int ordinal = 0;
  int world_size = 1;
  uint64_t seed = 0;
  TailMode tail = TailMode::kPad;
  bool shuffle = true;  // false: the data set's own order (evaluation)
};

// One batch of one ordinal: batch_size sample indices, the first n_valid of them real
// samples and the rest padding (repeats), so the shape never changes. In pad mode an
// ordinal's last batch may hold no real sample at all (n_valid == 0): it still runs the step,
// so a loss must divide by the global count of valid samples, never by a local zero.
struct BatchPlan {
  int64_t epoch = 0;
  int64_t index = 0;  // 0..batches_per_epoch-1, the same step number on every ordinal
  std::vector<int64_t> indices;
  int64_t n_valid = 0;
};

// A permutation of 0..n-1 by Fisher-Yates, a pure function of (n, seed, epoch).
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, int64_t epoch);

class ShardSampler {
 public:
  // Throws xs::InvalidArgument when the spec is inconsistent or would give 0 batches.
  explicit ShardSampler(const ShardSpec& spec);

  const ShardSpec& spec() const { return spec_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t global_batch_size() const { return spec_.batch_size * spec_.world_size; }

  // The global order of `epoch` (identity when shuffle is off). Same on every ordinal.
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  // This ordinal's batch `index` of the epoch whose global order is `order`.
  BatchPlan batch(std::span<const int64_t> order, int64_t epoch, int64_t index) const;
  // All of this ordinal's batches of `epoch`, in order.
  std::vector<BatchPlan> epoch_plan(int64_t epoch) const;

 private:
  ShardSpec spec_;
  int64_t batches_per_epoch_ = 0;
};

}  // namespace xs
