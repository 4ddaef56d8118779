#include "xla_spawn/replica/batch_loader.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include <sched.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"

namespace xs {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// n samples of 28x28 whose pixels all equal (index % 251) and whose label is index % 10, so a
// misplaced sample is visible in the batch contents.
std::shared_ptr<const ImageDataset> synthetic(int64_t n) {
  auto data = std::make_shared<ImageDataset>();
  data->n_samples = n;
  data->rows = 28;
  data->cols = 28;
  data->n_classes = 10;
  data->images.resize(static_cast<size_t>(n * 784));
  for (int64_t i = 0; i < n; ++i) {
    std::fill_n(data->images.begin() + i * 784, 784, static_cast<uint8_t>(i % 251));
    data->labels.push_back(static_cast<uint8_t>(i % 10));
  }
  return data;
}

// Waits (with a deadline) until pred() holds; false if it never does.
template <typename Pred>
bool eventually(Pred pred, std::chrono::seconds limit = std::chrono::seconds(30)) {
  const auto deadline = Clock::now() + limit;
  while (!pred()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // polling, bounded above
  }
  return true;
}

TEST(BatchLoader, DeliversEveryBatchInOrderThenEnds) {
  const ShardSpec spec{.n_samples = 100, .batch_size = 7, .ordinal = 1, .world_size = 2, .seed = 4};
  auto loader = make_image_loader(synthetic(100), spec, Normalization{});
  const auto plans = ShardSampler(spec).epoch_plan(3);
  loader->start_epoch(3);
  for (const BatchPlan& plan : plans) {
    auto batch = loader->next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(batch->epoch, 3);
    EXPECT_EQ(batch->index, plan.index);
    EXPECT_EQ(batch->sample_indices, plan.indices);
    EXPECT_EQ(batch->n_valid, plan.n_valid);
  }
  EXPECT_FALSE(loader->next().has_value());
  EXPECT_FALSE(loader->next().has_value());
  EXPECT_EQ(loader->stats().batches_delivered, static_cast<int64_t>(plans.size()));
}

TEST(BatchLoader, BatchesHoldNormalisedImagesLabelsAndAPaddingMask) {
  const ShardSpec spec{.n_samples = 10, .batch_size = 4, .world_size = 1, .tail = TailMode::kPad};
  const Normalization norm{0.5f, 0.25f};
  auto loader = make_image_loader(synthetic(10), spec, norm);
  loader->start_epoch(0);
  std::optional<HostBatch> batch;
  for (int i = 0; i < 3; ++i) batch = loader->next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->image_shape, (std::vector<int64_t>{4, 1, 28, 28}));
  EXPECT_EQ(batch->n_valid, 2);  // 10 samples: the third batch has 2 real, 2 padding
  EXPECT_EQ(batch->mask, (std::vector<float>{1, 1, 0, 0}));
  for (int64_t j = 0; j < 4; ++j) {
    const int64_t sample = batch->sample_indices[static_cast<size_t>(j)];
    EXPECT_EQ(batch->labels[static_cast<size_t>(j)], sample % 10);
    const float expected = (static_cast<float>(sample % 251) / 255.0f - 0.5f) / 0.25f;
    EXPECT_FLOAT_EQ(batch->images[static_cast<size_t>(j * 784 + 400)], expected);
  }
}

TEST(BatchLoader, ResumingMidEpochGivesTheRemainingBatches) {
  const ShardSpec spec{.n_samples = 200, .batch_size = 8, .world_size = 1, .seed = 12};
  auto loader = make_image_loader(synthetic(200), spec, Normalization{});
  const auto plans = ShardSampler(spec).epoch_plan(1);
  loader->start_epoch(1, 20);
  for (size_t b = 20; b < plans.size(); ++b) {
    auto batch = loader->next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(batch->sample_indices, plans[b].indices);
  }
  EXPECT_FALSE(loader->next().has_value());
}

TEST(BatchLoader, PrefetchesAtMostDepthBatchesAhead) {
  std::atomic<int64_t> built{0};
  const ShardSpec spec{.n_samples = 64, .batch_size = 1, .world_size = 1};
  const auto data = synthetic(64);
  BatchLoader loader(
      ShardSampler(spec),
      [&](const BatchPlan& plan) {
        ++built;
        return make_image_batch(*data, plan, Normalization{});
      },
      LoaderOptions{.prefetch_depth = 3, .mode = PrefetchMode::kThread});
  loader.start_epoch(0);
  // depth batches queued plus one built and waiting for a free slot.
  ASSERT_TRUE(eventually([&] { return built.load() >= 4; }));
  for (int64_t delivered = 0; delivered < 64; ++delivered) {
    EXPECT_LE(built.load(), delivered + 4);
    ASSERT_TRUE(loader.next().has_value());
  }
}

TEST(BatchLoader, StopsCleanlyMidEpochWithTheWorkerBlockedOnAFullQueue) {
  const ShardSpec spec{.n_samples = 1000, .batch_size = 4, .world_size = 1};
  const auto start = Clock::now();
  {
    auto loader =
        make_image_loader(synthetic(1000), spec, Normalization{},
                          LoaderOptions{.prefetch_depth = 1, .mode = PrefetchMode::kThread});
    loader->start_epoch(0);
    ASSERT_TRUE(loader->next().has_value());
    ASSERT_TRUE(loader->next().has_value());
  }  // the destructor stops and joins the worker
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
}

TEST(BatchLoader, StartingAnotherEpochAbandonsTheCurrentOne) {
  const ShardSpec spec{.n_samples = 100, .batch_size = 5, .world_size = 1, .seed = 1};
  auto loader = make_image_loader(synthetic(100), spec, Normalization{});
  loader->start_epoch(0);
  ASSERT_TRUE(loader->next().has_value());
  loader->start_epoch(1);
  const auto batch = loader->next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->epoch, 1);
  EXPECT_EQ(batch->index, 0);
  EXPECT_EQ(batch->sample_indices, ShardSampler(spec).epoch_plan(1)[0].indices);
}

TEST(BatchLoader, WorkerErrorIsRethrownAfterTheBatchesBuiltBeforeIt) {
  const ShardSpec spec{.n_samples = 10, .batch_size = 1, .world_size = 1};
  const auto data = synthetic(10);
  BatchLoader loader(ShardSampler(spec), [&](const BatchPlan& plan) {
    if (plan.index == 3) throw InvalidArgument("corrupt sample in batch 3");
    return make_image_batch(*data, plan, Normalization{});
  });
  loader.start_epoch(0);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader.next().has_value());
  try {
    loader.next();
    FAIL() << "expected the worker's InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("corrupt sample in batch 3"));
  }
  EXPECT_FALSE(loader.next().has_value());
}

TEST(BatchLoader, NextTimesOutWhenTheWorkerStalls) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  const ShardSpec spec{.n_samples = 4, .batch_size = 1, .world_size = 1};
  const auto data = synthetic(4);
  BatchLoader loader(
      ShardSampler(spec),
      [&](const BatchPlan& plan) {
        std::unique_lock lock(mu);
        // Bounded so a broken test cannot hang: the test releases it right after next() fails.
        cv.wait_for(lock, std::chrono::seconds(60), [&] { return release; });
        return make_image_batch(*data, plan, Normalization{});
      },
      LoaderOptions{.timeout_ms = 50, .mode = PrefetchMode::kThread});
  loader.start_epoch(0);
  try {
    loader.next();
    ADD_FAILURE() << "expected Timeout";
  } catch (const Timeout& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("no batch 0 of epoch 0 after 50 ms"));
  }
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  EXPECT_TRUE(loader.next().has_value());
}

// The inline mode (no thread) keeps the threaded loader's contract.
class BatchLoaderModes : public ::testing::TestWithParam<PrefetchMode> {};

TEST_P(BatchLoaderModes, DeliverTheSameBatchesAndResumeMidEpoch) {
  const ShardSpec spec{.n_samples = 90, .batch_size = 4, .ordinal = 2, .world_size = 3, .seed = 9};
  auto loader = make_image_loader(synthetic(90), spec, Normalization{}, {.mode = GetParam()});
  EXPECT_EQ(loader->threaded(), GetParam() == PrefetchMode::kThread);
  const auto plans = ShardSampler(spec).epoch_plan(2);
  loader->start_epoch(2, 3);
  for (size_t b = 3; b < plans.size(); ++b) {
    auto batch = loader->next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(batch->epoch, 2);
    EXPECT_EQ(batch->index, static_cast<int64_t>(b));
    EXPECT_EQ(batch->sample_indices, plans[b].indices);
  }
  EXPECT_FALSE(loader->next().has_value());
  loader->start_epoch(3);
  ASSERT_TRUE(loader->next().has_value());
  loader->stop();
  EXPECT_FALSE(loader->next().has_value());
  EXPECT_EQ(loader->stats().batches_delivered, static_cast<int64_t>(plans.size()) - 3 + 1);
}

TEST_P(BatchLoaderModes, AnErrorEndsTheEpoch) {
  const ShardSpec spec{.n_samples = 10, .batch_size = 1, .world_size = 1};
  const auto data = synthetic(10);
  BatchLoader loader(ShardSampler(spec),
                     [&](const BatchPlan& plan) {
                       if (plan.index == 2) throw InvalidArgument("corrupt sample in batch 2");
                       return make_image_batch(*data, plan, Normalization{});
                     },
                     {.mode = GetParam()});
  loader.start_epoch(0);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(loader.next().has_value());
  EXPECT_THROW(loader.next(), InvalidArgument);
  EXPECT_FALSE(loader.next().has_value());
}

INSTANTIATE_TEST_SUITE_P(Modes, BatchLoaderModes,
                         ::testing::Values(PrefetchMode::kThread, PrefetchMode::kInline),
                         [](const auto& info) {
                           return info.param == PrefetchMode::kThread ? "Thread" : "Inline";
                         });

TEST(BatchLoader, AutoModeKeepsTheThreadOnlyWhenACoreIsFree) {
  const auto online = static_cast<int64_t>(sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_FALSE(prefetch_on_thread(online));
  EXPECT_FALSE(prefetch_on_thread(2 * online));
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  EXPECT_EQ(prefetch_on_thread(1), online > 1 && CPU_COUNT(&allowed) > 1);
  const ShardSpec spec{.n_samples = 8, .batch_size = 2, .world_size = static_cast<int>(online)};
  EXPECT_FALSE(make_image_loader(synthetic(8), spec, Normalization{})->threaded());
}

TEST(BatchLoader, NextBeforeStartEpochIsAnError) {
  auto loader = make_image_loader(synthetic(4), {.n_samples = 4}, Normalization{});
  EXPECT_THROW(loader->next(), InvalidArgument);
}

TEST(BatchLoader, RejectsADataSetThatDoesNotMatchTheSpec) {
  EXPECT_THROW(make_image_loader(synthetic(4), {.n_samples = 5}, Normalization{}), InvalidArgument);
}

// The real test split through four ordinals' loaders: every image exactly once, labels intact.
TEST(BatchLoader, FourOrdinalsCoverTheFashionMnistTestSplitOnce) {
  auto data = std::make_shared<const ImageDataset>(load_fashion_mnist("", Split::kTest));
  std::vector<int> seen(10000, 0);
  for (int k = 0; k < 4; ++k) {
    const ShardSpec spec{.n_samples = data->n_samples,
                         .batch_size = 128,
                         .ordinal = k,
                         .world_size = 4,
                         .seed = 5,
                         .tail = TailMode::kPad};
    auto loader = make_image_loader(data, spec, kFashionMnistNormalization);
    EXPECT_EQ(loader->batches_per_epoch(), 20);  // ceil(10000 / 512)
    loader->start_epoch(0);
    while (auto batch = loader->next()) {
      for (int64_t j = 0; j < batch->n_valid; ++j) {
        const int64_t s = batch->sample_indices[static_cast<size_t>(j)];
        ++seen[static_cast<size_t>(s)];
        ASSERT_EQ(batch->labels[static_cast<size_t>(j)], data->labels[static_cast<size_t>(s)]);
      }
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 10000);
}

}  // namespace
}  // namespace xs
