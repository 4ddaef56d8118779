// The epoch loop and evaluation of Trainer (trainer.cpp holds setup, steps and checkpoints).
#include "examples/train_fmnist/trainer.h"

#include <chrono>
#include <csignal>

#include <fmt/format.h>

#include "xla_spawn/replica/progress.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/replica/xm_collectives.h"
#include "xla_spawn/runtime/autocast.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs::fmnist {

bool Trainer::train_epoch(int64_t epoch, int64_t first_batch) {
  xm::DeviceLoader loader(*train_loader_);
  loader.start_epoch(epoch, first_batch);
  const int64_t global_batch = options_.batch_size * xm::world_size();
  xm::ProgressBar bar(fmt::format("epoch {}/{}", epoch + 1, options_.epochs),
                      loader.batches_per_epoch(), global_batch, first_batch);
  const auto start = std::chrono::steady_clock::now();
  double loss_sum = 0;
  int64_t n_steps = 0, next_batch = first_batch;
  bool finished = true;
  while (true) {
    if (options_.max_steps > 0 && global_step_ >= options_.max_steps) {
      finished = next_batch >= loader.batches_per_epoch();
      break;
    }
    timer_.begin();
    const std::optional<xm::DeviceBatch> batch = loader.next();
    if (!batch) break;
    timer_.data_ready();
    if (options_.fail_at_step > 0 && global_step_ == options_.fail_at_step &&
        xm::context().attempt == 0 && xm::ordinal() == xm::world_size() - 1) {
      std::raise(SIGKILL);  // fault injection for the restart test: no cleanup, no flush
    }
    double loss = 0;
    train_step(*batch, loss);
    timer_.end(epoch, batch->index);
    loss_sum += loss;
    ++n_steps;
    next_batch = batch->index + 1;
    bar.update(next_batch, loss);
    if (options_.checkpoint_every > 0 && global_step_ % options_.checkpoint_every == 0 &&
        next_batch < loader.batches_per_epoch()) {
      save(epoch, next_batch);
    }
  }
  bar.finish();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result_.train_seconds += seconds;
  const double mean_loss =
      xm::mesh_reduce("epoch_loss", n_steps ? loss_sum / n_steps : 0, ReduceOp::kMean);
  xm::master_print("epoch {}/{}: {} steps, train loss {:.4f}, {:.1f} s, {:.0f} samples/s",
                   epoch + 1, options_.epochs, n_steps, mean_loss, seconds,
                   seconds > 0 ? n_steps * global_batch / seconds : 0.0);
  if (!finished) save(epoch, next_batch);
  return finished;
}

double Trainer::evaluate() {
  model_->eval();
  NoGradGuard no_grad;
  const ShardSpec spec{.n_samples = test_data_->n_samples,
                       .batch_size = options_.batch_size,
                       .ordinal = xm::ordinal(),
                       .world_size = xm::world_size(),
                       .seed = options_.seed,
                       .tail = TailMode::kPad,
                       .shuffle = false};
  auto host = make_image_loader(test_data_, spec, kFashionMnistNormalization);
  xm::DeviceLoader loader(*host);
  loader.start_epoch(0);
  int64_t counts[2] = {0, 0};  // correct, evaluated
  const AutocastGuard autocast(compute_dtype(options_));  // as trained
  while (const std::optional<xm::DeviceBatch> b = loader.next()) {
    const Tensor predicted = argmax((*model_)(b->images), 1);
    mark_step();
    const std::vector<int64_t> p = predicted.to_vector<int64_t>();
    const std::vector<int64_t> labels = b->labels.to_vector<int64_t>();
    for (int64_t i = 0; i < b->n_valid; ++i) counts[0] += p[i] == labels[i];
    counts[1] += b->n_valid;
  }
  xm::all_reduce(std::span<int64_t>(counts), ReduceOp::kSum);
  model_->train();
  return counts[1] > 0 ? static_cast<double>(counts[0]) / static_cast<double>(counts[1]) : 0.0;
}

TrainResult Trainer::run() {
  if (options_.resume) resume();
  xm::master_print(
      "train_fmnist: {} on {} train / {} test samples, {} replicas x batch {}, {} lr {}, "
      "{} steps per epoch",
      options_.model, train_data_->n_samples, test_data_->n_samples, xm::world_size(),
      options_.batch_size, options_.optimizer, options_.lr, train_loader_->batches_per_epoch());
  xm::master_print("precision: {}", precision_summary(options_));
  for (int64_t epoch = start_epoch_; epoch < options_.epochs; ++epoch) {
    if (options_.max_steps > 0 && global_step_ >= options_.max_steps) break;
    const bool finished = train_epoch(epoch, epoch == start_epoch_ ? start_batch_ : 0);
    if (options_.eval) {
      result_.test_accuracy = evaluate();
      xm::master_print("epoch {}/{}: test accuracy {:.4f}", epoch + 1, options_.epochs,
                       result_.test_accuracy);
    }
    if (!finished) break;
    ++result_.epochs_completed;
    save(epoch + 1, 0);
  }
  if (result_.train_seconds > 0) {
    result_.samples_per_second =
        static_cast<double>(result_.steps * options_.batch_size * xm::world_size()) /
        result_.train_seconds;
  }
  if (!options_.step_timing_csv.empty()) timer_.write_csv(options_.step_timing_csv);
  return result_;
}

}  // namespace xs::fmnist
