#pragma once
// A prefetching batch loader (PyTorch/XLA's ParallelLoader on the host side): a background
// thread builds this ordinal's batches of an epoch, in order, into a bounded queue while the
// training step runs. Errors in the worker are re-thrown by next(); destruction (or the next
// start_epoch) stops and joins the worker, even mid-epoch. One consumer thread calls
// start_epoch/next/stop; the worker is the only other thread. When every core already runs a
// replica (PrefetchMode::kAuto) batches are built inline in next() instead: a loader thread
// could only take turns with its own replica, and would add a wake-up per batch.
//
//   auto loader = xs::make_image_loader(train, spec, xs::kFashionMnistNormalization);
//   loader->start_epoch(epoch);              // or (epoch, first_batch) when resuming
//   while (auto batch = loader->next()) step(*batch);

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "xla_spawn/replica/fashion_mnist.h"
#include "xla_spawn/replica/host_batch.h"
#include "xla_spawn/replica/shard_sampler.h"

namespace xs {

// kAuto: a thread when a core is free for it (see prefetch_on_thread), else inline.
enum class PrefetchMode { kAuto, kThread, kInline };

struct LoaderOptions {
  int prefetch_depth = 2;        // ready batches held at most (1..64)
  int64_t timeout_ms = 120'000;  // next() gives up (xs::Timeout) when no batch comes this long
  PrefetchMode mode = PrefetchMode::kAuto;
};

// Whether a loader of one of `world_size` replicas gets a thread under kAuto: only when the
// replicas leave a CPU free (fewer replicas than online CPUs, and this process may run on
// more than one; xla-spawn pins each replica to one core when 2 <= N <= CPUs).
bool prefetch_on_thread(int64_t world_size);

struct LoaderStats {
  int64_t batches_delivered = 0;
  int64_t consumer_waits = 0;  // next() found the queue empty: the input pipeline lagged
  double consumer_wait_ms = 0.0;
};

class BatchLoader {
 public:
  using BatchFn = std::function<HostBatch(const BatchPlan&)>;

  // `make_batch` runs on the worker thread; it must not touch the caller's unsynchronised state.
  BatchLoader(ShardSampler sampler, BatchFn make_batch, LoaderOptions options = {});
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Stops any running epoch, then prefetches batches first_batch.. of `epoch`.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // The next batch of the current epoch; nullopt after its last. Re-throws the worker's error
  // (after the batches built before it); xs::Timeout after options.timeout_ms without a batch.
  std::optional<HostBatch> next();
  // Stops and joins the worker; batches not yet taken are discarded. Idempotent.
  void stop();

  int64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  const ShardSampler& sampler() const { return sampler_; }
  LoaderStats stats() const;
  // Whether batches are built on the worker thread (false: inline in next()).
  bool threaded() const { return threaded_; }

 private:
  void run(int64_t epoch, int64_t first_batch);
  std::optional<HostBatch> next_inline();

  const ShardSampler sampler_;
  const BatchFn make_batch_;
  const LoaderOptions options_;
  const bool threaded_;
  std::vector<int64_t> inline_order_;  // inline mode: the epoch's sample order

  mutable std::mutex mu_;
  std::condition_variable not_empty_;  // consumer waits: a batch arrived or the worker ended
  std::condition_variable not_full_;   // worker waits: a slot freed or stop requested
  std::deque<HostBatch> queue_;        // guarded by mu_
  bool stop_ = false;                  // guarded by mu_
  bool worker_done_ = true;            // guarded by mu_
  bool started_ = false;               // guarded by mu_
  int64_t epoch_ = 0;                  // guarded by mu_
  int64_t next_index_ = 0;             // guarded by mu_: index next() returns next
  std::exception_ptr error_;           // guarded by mu_
  LoaderStats stats_;                  // guarded by mu_
  std::thread worker_;
};

// A loader over an image data set (shared, read-only, so the worker may read it).
std::unique_ptr<BatchLoader> make_image_loader(std::shared_ptr<const ImageDataset> dataset,
                                               const ShardSpec& spec, Normalization norm,
                                               LoaderOptions options = {});

}  // namespace xs
