#pragma once
// The training loop of train_fmnist: sharded data, one compiled step per batch (forward, masked
// loss, backward, in-graph gradient all-reduce, update), test accuracy after each epoch
// (evaluation sharded over the replicas and summed), checkpoints each epoch and every K steps,
// and resuming at the exact epoch and batch a checkpoint names.
//
//   xs::xm::init();
//   xs::fmnist::Trainer trainer(options);
//   xs::fmnist::TrainResult r = trainer.run();

#include <cstdint>
#include <memory>
#include <string>

#include "examples/train_fmnist/fault_hook.h"
#include "examples/train_fmnist/options.h"
#include "xla_spawn/replica/step_timing.h"
#include "xla_spawn/replica/batch_loader.h"
#include "xla_spawn/replica/device_loader.h"
#include "xla_spawn/base/dtype.h"
#include "xla_spawn/runtime/nn/module.h"
#include "xla_spawn/runtime/optim/optimizer.h"

namespace xs::fmnist {

struct TrainResult {
  double test_accuracy = -1;  // of the last evaluation; -1 when none ran
  int64_t steps = 0;          // optimizer steps taken in this run (not counting resumed ones)
  int64_t epochs_completed = 0;
  double train_seconds = 0;       // wall time of training steps (no evaluation)
  double samples_per_second = 0;  // global samples per second of training
};

// The autocast dtype of --precision: kBF16 for bf16, kF32 (autocast off) for f32.
DType compute_dtype(const TrainOptions& options);
// What ran, for the log: "f32", "bf16 autocast (...)", or XLA_SPAWN_USE_BF16's.
std::string precision_summary(const TrainOptions& options);

class Trainer {
 public:
  explicit Trainer(TrainOptions options);
  TrainResult run();

 private:
  void resume();
  // Runs the epoch from `first_batch`; false when --max-steps stopped it.
  bool train_epoch(int64_t epoch, int64_t first_batch);
  void train_step(const xm::DeviceBatch& batch, double& loss);
  double evaluate();
  void save(int64_t epoch, int64_t next_batch);
  void set_learning_rate();

  TrainOptions options_;
  std::shared_ptr<const ImageDataset> train_data_, test_data_;
  std::unique_ptr<BatchLoader> train_loader_;
  std::shared_ptr<Module> model_;
  std::unique_ptr<Optimizer> optimizer_;
  int64_t global_step_ = 0;  // optimizer steps since the start of training (resumes count)
  int64_t total_steps_ = 0;  // epochs * batches per epoch: the schedule's length
  int64_t start_epoch_ = 0, start_batch_ = 0;
  xm::StepTimer timer_{!options_.step_timing_csv.empty()};
  std::unique_ptr<FaultHook> fault_hook_;  // XLA_SPAWN_TEST_FAULT; inactive unless set
  TrainResult result_;
};

}  // namespace xs::fmnist
