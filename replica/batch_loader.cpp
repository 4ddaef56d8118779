#include "xla_spawn/replica/batch_loader.h"

#include <sched.h>
#include <unistd.h>

#include <utility>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"

namespace xs {

bool prefetch_on_thread(int64_t world_size) {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const int may_run_on =
      sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : 1;
  return world_size < online && may_run_on > 1;
}

BatchLoader::BatchLoader(ShardSampler sampler, BatchFn make_batch, LoaderOptions options)
    : sampler_(std::move(sampler)),
      make_batch_(std::move(make_batch)),
      options_(options),
      threaded_(
          options.mode == PrefetchMode::kThread ||
          (options.mode == PrefetchMode::kAuto && prefetch_on_thread(sampler_.spec().world_size))) {
  XS_CHECK_ARG(options.prefetch_depth >= 1 && options.prefetch_depth <= 64,
               "loader: prefetch depth {} must be in 1..64", options.prefetch_depth);
  XS_CHECK_ARG(options.timeout_ms >= 1, "loader: timeout_ms {} must be positive",
               options.timeout_ms);
  XS_CHECK_ARG(static_cast<bool>(make_batch_), "loader: no batch function given");
}

BatchLoader::~BatchLoader() {
  stop();
}

void BatchLoader::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  not_full_.notify_all();
  // The worker checks stop_ after each batch, so the join waits for at most one batch build.
  if (worker_.joinable()) worker_.join();
  std::lock_guard lock(mu_);
  queue_.clear();
  worker_done_ = true;
}

void BatchLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  XS_CHECK_ARG(epoch >= 0, "loader: epoch {} must be >= 0", epoch);
  XS_CHECK_ARG(first_batch >= 0 && first_batch <= batches_per_epoch(),
               "loader: first batch {} not in 0..{} (batches per epoch)", first_batch,
               batches_per_epoch());
  stop();
  {
    std::lock_guard lock(mu_);
    stop_ = false;
    worker_done_ = false;
    started_ = true;
    epoch_ = epoch;
    next_index_ = first_batch;
    error_ = nullptr;
    if (!threaded_) {
      inline_order_ = sampler_.epoch_order(epoch);
      worker_done_ = true;
      return;
    }
  }
  try {
    worker_ = std::thread([this, epoch, first_batch] { run(epoch, first_batch); });
  } catch (...) {  // no thread (resource limits): next() must not wait for one
    std::lock_guard lock(mu_);
    worker_done_ = true;
    throw;
  }
}

void BatchLoader::run(int64_t epoch, int64_t first_batch) {
  try {
    const std::vector<int64_t> order = sampler_.epoch_order(epoch);
    for (int64_t b = first_batch; b < batches_per_epoch(); ++b) {
      HostBatch batch = make_batch_(sampler_.batch(order, epoch, b));
      batch.epoch = epoch;  // stamped here so next() can rely on them whatever make_batch_ does
      batch.index = b;
      std::unique_lock lock(mu_);
      // Bounded by the stop flag: stop() sets it and notifies.
      not_full_.wait(lock, [&] {
        return stop_ || queue_.size() < static_cast<size_t>(options_.prefetch_depth);
      });
      if (stop_) break;
      queue_.push_back(std::move(batch));
      lock.unlock();
      not_empty_.notify_one();
    }
  } catch (...) {
    std::lock_guard lock(mu_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard lock(mu_);
    worker_done_ = true;
  }
  not_empty_.notify_all();
}

std::optional<HostBatch> BatchLoader::next_inline() {
  int64_t epoch, index;
  {
    std::lock_guard lock(mu_);
    if (stop_ || next_index_ >= batches_per_epoch()) return std::nullopt;
    epoch = epoch_;
    index = next_index_++;
  }
  HostBatch batch;
  try {
    batch = make_batch_(sampler_.batch(inline_order_, epoch, index));
  } catch (...) {
    std::lock_guard lock(mu_);
    next_index_ = batches_per_epoch();  // as the worker: an error ends the epoch
    throw;
  }
  batch.epoch = epoch;
  batch.index = index;
  std::lock_guard lock(mu_);
  ++stats_.batches_delivered;
  return batch;
}

std::optional<HostBatch> BatchLoader::next() {
  std::unique_lock lock(mu_);
  XS_CHECK_ARG(started_, "loader: next() called before start_epoch()");
  if (!threaded_) {
    lock.unlock();
    return next_inline();
  }
  if (queue_.empty() && !worker_done_) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::milliseconds(options_.timeout_ms);
    ++stats_.consumer_waits;
    const bool ready =
        not_empty_.wait_until(lock, deadline, [&] { return !queue_.empty() || worker_done_; });
    stats_.consumer_wait_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!ready) {
      throw Timeout(fmt::format("loader: no batch {} of epoch {} after {} ms (prefetch depth {})",
                                next_index_, epoch_, options_.timeout_ms, options_.prefetch_depth));
    }
  }
  if (!queue_.empty()) {
    HostBatch batch = std::move(queue_.front());
    queue_.pop_front();
    ++next_index_;
    ++stats_.batches_delivered;
    lock.unlock();
    not_full_.notify_one();
    return batch;
  }
  if (error_) {
    std::exception_ptr error = std::exchange(error_, nullptr);
    std::rethrow_exception(error);
  }
  return std::nullopt;
}

LoaderStats BatchLoader::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::unique_ptr<BatchLoader> make_image_loader(std::shared_ptr<const ImageDataset> dataset,
                                               const ShardSpec& spec, Normalization norm,
                                               LoaderOptions options) {
  XS_CHECK_ARG(dataset != nullptr, "make_image_loader: no data set");
  XS_CHECK_ARG(spec.n_samples == dataset->n_samples,
               "make_image_loader: spec says {} samples, the data set has {}", spec.n_samples,
               dataset->n_samples);
  auto make_batch = [dataset, norm](const BatchPlan& plan) {
    return make_image_batch(*dataset, plan, norm);
  };
  return std::make_unique<BatchLoader>(ShardSampler(spec), std::move(make_batch), options);
}

}  // namespace xs
