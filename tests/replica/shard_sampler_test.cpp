#include "xla_spawn/replica/shard_sampler.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"

namespace xs {
namespace {

using ::testing::HasSubstr;

// Vigna's reference splitmix64.c from state 1234567: a changed generator would silently
// change every run's data order, so pin it.
TEST(SplitMix64, MatchesTheReferenceSequence) {
  SplitMix64 rng(1234567);
  EXPECT_EQ(rng.next(), 6457827717110365317ull);
  EXPECT_EQ(rng.next(), 3203168211198807973ull);
  EXPECT_EQ(rng.next(), 9817491932198370423ull);
}

TEST(SplitMix64, BelowIsRoughlyUniform) {
  SplitMix64 rng(7);
  std::map<uint64_t, int> counts;
  for (int i = 0; i < 60000; ++i) ++counts[rng.below(6)];
  ASSERT_EQ(counts.size(), 6u);
  for (const auto& [value, count] : counts) EXPECT_NEAR(count, 10000, 500) << value;
}

TEST(SeededPermutation, IsAPermutationThatDependsOnSeedAndEpoch) {
  const auto a = seeded_permutation(1000, 5, 0);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_EQ(a, seeded_permutation(1000, 5, 0));
  EXPECT_NE(a, seeded_permutation(1000, 5, 1));
  EXPECT_NE(a, seeded_permutation(1000, 6, 0));
}

TEST(SeededPermutation, AllOrdersOfThreeAreEquallyLikely) {
  std::map<std::vector<int64_t>, int> counts;
  for (int64_t epoch = 0; epoch < 6000; ++epoch) ++counts[seeded_permutation(3, 11, epoch)];
  ASSERT_EQ(counts.size(), 6u);
  for (const auto& [order, count] : counts) EXPECT_NEAR(count, 1000, 150);
}

// (world size, tail mode); each test sweeps samples x batch size, odd sizes included.
using Case = std::tuple<int, TailMode>;

class ShardCoverage : public ::testing::TestWithParam<Case> {};

// Every ordinal's batches of one epoch, as the ordinals would compute them independently.
std::vector<std::vector<BatchPlan>> all_plans(const ShardSpec& base, int64_t epoch) {
  std::vector<std::vector<BatchPlan>> plans;
  for (int k = 0; k < base.world_size; ++k) {
    ShardSpec spec = base;
    spec.ordinal = k;
    plans.push_back(ShardSampler(spec).epoch_plan(epoch));
  }
  return plans;
}

void check_coverage(int world, TailMode tail, int64_t n, int64_t batch) {
  const ShardSpec spec{
      .n_samples = n, .batch_size = batch, .world_size = world, .seed = 3, .tail = tail};
  if (tail == TailMode::kDrop && n < world * batch) {
    EXPECT_THROW(ShardSampler{spec}, InvalidArgument);
    return;
  }
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const auto plans = all_plans(spec, epoch);
    std::vector<int> seen(static_cast<size_t>(n), 0);
    int64_t padding = 0;
    for (int k = 0; k < world; ++k) {
      ASSERT_EQ(plans[k].size(), plans[0].size()) << "ordinal " << k;
      for (const BatchPlan& b : plans[k]) {
        ASSERT_EQ(static_cast<int64_t>(b.indices.size()), batch);
        ASSERT_GE(b.n_valid, 0);
        for (int64_t j = 0; j < batch; ++j) {
          const int64_t s = b.indices[static_cast<size_t>(j)];
          ASSERT_TRUE(s >= 0 && s < n) << s;
          if (j < b.n_valid)
            ++seen[static_cast<size_t>(s)];
          else
            ++padding;
        }
      }
    }
    const int64_t global_steps = static_cast<int64_t>(plans[0].size());
    const auto never = std::count(seen.begin(), seen.end(), 0);
    EXPECT_EQ(std::count_if(seen.begin(), seen.end(), [](int c) { return c > 1; }), 0);
    if (tail == TailMode::kPad) {
      EXPECT_EQ(never, 0);
      EXPECT_EQ(padding, global_steps * world * batch - n);
      EXPECT_LT(padding, world * batch);
    } else {
      EXPECT_EQ(padding, 0);
      EXPECT_EQ(never, n - global_steps * world * batch);
      EXPECT_LT(never, world * batch);
    }
  }
}

TEST_P(ShardCoverage, EverySampleOnExactlyOneOrdinalWithEqualBatchCounts) {
  const auto [world, tail] = GetParam();
  for (const int64_t n : {1, 13, 64, 100, 1000}) {
    for (const int64_t batch : {1, 3, 8}) {
      SCOPED_TRACE("samples " + std::to_string(n) + ", batch " + std::to_string(batch));
      check_coverage(world, tail, n, batch);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardCoverage,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values(TailMode::kDrop, TailMode::kPad)),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "N" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::string(tail_mode_name(std::get<1>(info.param)));
                         });

TEST(ShardSampler, GlobalBatchesAreTheSameForOneReplicaWithTheGlobalBatchSize) {
  const ShardSpec four{.n_samples = 1000, .batch_size = 8, .world_size = 4, .seed = 9};
  const ShardSpec one{.n_samples = 1000, .batch_size = 32, .world_size = 1, .seed = 9};
  const auto plans = all_plans(four, 2);
  const auto single = ShardSampler(one).epoch_plan(2);
  ASSERT_EQ(single.size(), plans[0].size());
  for (size_t b = 0; b < single.size(); ++b) {
    std::multiset<int64_t> global;
    for (const auto& ordinal : plans) {
      global.insert(ordinal[b].indices.begin(), ordinal[b].indices.begin() + ordinal[b].n_valid);
    }
    const std::multiset<int64_t> expected(single[b].indices.begin(),
                                          single[b].indices.begin() + single[b].n_valid);
    EXPECT_EQ(global, expected) << "step " << b;
  }
}

TEST(ShardSampler, EpochsDifferAndTheSameSeedRepeats) {
  const ShardSpec spec{
      .n_samples = 500, .batch_size = 10, .ordinal = 1, .world_size = 3, .seed = 77};
  const auto e0 = ShardSampler(spec).epoch_plan(0);
  const auto e0_again = ShardSampler(spec).epoch_plan(0);
  const auto e1 = ShardSampler(spec).epoch_plan(1);
  ShardSpec other_seed = spec;
  other_seed.seed = 78;
  const auto s78 = ShardSampler(other_seed).epoch_plan(0);
  ASSERT_EQ(e0.size(), e1.size());
  int same_as_again = 0, same_as_e1 = 0, same_as_s78 = 0;
  for (size_t b = 0; b < e0.size(); ++b) {
    same_as_again += e0[b].indices == e0_again[b].indices;
    same_as_e1 += e0[b].indices == e1[b].indices;
    same_as_s78 += e0[b].indices == s78[b].indices;
  }
  EXPECT_EQ(same_as_again, static_cast<int>(e0.size()));
  EXPECT_EQ(same_as_e1, 0);
  EXPECT_EQ(same_as_s78, 0);
}

TEST(ShardSampler, WithoutShuffleReadsInDataSetOrder) {
  const ShardSpec spec{.n_samples = 10,
                       .batch_size = 2,
                       .ordinal = 1,
                       .world_size = 2,
                       .tail = TailMode::kPad,
                       .shuffle = false};
  const auto plans = ShardSampler(spec).epoch_plan(4);
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_EQ(plans[0].indices, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(plans[2].indices, (std::vector<int64_t>{9, 1}));  // position 11 wraps to sample 1
  EXPECT_EQ(plans[2].n_valid, 1);
}

TEST(ShardSampler, RejectsBadSpecsNamingTheValue) {
  auto error = [](const ShardSpec& spec) {
    try {
      ShardSampler{spec};
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_THAT(error({.n_samples = 10, .ordinal = 2, .world_size = 2}), HasSubstr("ordinal 2"));
  EXPECT_THAT(error({.n_samples = 10, .batch_size = 0}), HasSubstr("batch size 0"));
  EXPECT_THAT(error({.n_samples = 0}), HasSubstr("0 samples"));
  EXPECT_THAT(error({.n_samples = 10, .batch_size = 4, .world_size = 3, .tail = TailMode::kDrop}),
              HasSubstr("10 samples < world size 3 x batch size 4 = 12"));
}

}  // namespace
}  // namespace xs
