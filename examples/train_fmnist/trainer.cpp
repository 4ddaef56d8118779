#include "examples/train_fmnist/trainer.h"

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "examples/train_fmnist/models.h"
#include "xla_spawn/replica/divergence_check.h"
#include "xla_spawn/replica/fashion_mnist.h"
#include "xla_spawn/replica/optimizer_step.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/replica/xm_checkpoint.h"
#include "xla_spawn/runtime/autocast.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/loss.h"
#include "xla_spawn/runtime/optim/adam.h"
#include "xla_spawn/runtime/optim/lr_schedule.h"
#include "xla_spawn/runtime/optim/sgd.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs::fmnist {
namespace {

// The first `n` samples (all when n is 0 or larger than the set).
std::shared_ptr<const ImageDataset> load_prefix(const std::string& dir, Split split, int64_t n) {
  auto data = std::make_shared<ImageDataset>(load_fashion_mnist(dir, split));
  if (n > data->n_samples) {
    throw InvalidArgument(fmt::format("--{}-samples {}: the {} set has {} samples",
                                      split == Split::kTrain ? "train" : "test", n,
                                      split == Split::kTrain ? "training" : "test",
                                      data->n_samples));
  }
  if (n > 0 && n < data->n_samples) {
    data->n_samples = n;
    data->images.resize(static_cast<size_t>(n * data->sample_elems()));
    data->labels.resize(static_cast<size_t>(n));
  }
  return data;
}

ShardSpec shard_spec(const ImageDataset& data, int64_t batch_size, uint64_t seed, bool shuffle) {
  return ShardSpec{.n_samples = data.n_samples,
                   .batch_size = batch_size,
                   .ordinal = xm::ordinal(),
                   .world_size = xm::world_size(),
                   .seed = seed,
                   .tail = TailMode::kPad,
                   .shuffle = shuffle};
}

std::unique_ptr<Optimizer> make_optimizer(const TrainOptions& o, std::vector<Tensor> params) {
  if (o.optimizer == "sgd") {
    return std::make_unique<SGD>(
        std::move(params),
        SgdOptions{.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
  }
  const AdamOptions adam{.lr = o.lr, .weight_decay = o.weight_decay};
  if (o.optimizer == "adamw") return std::make_unique<AdamW>(std::move(params), adam);
  return std::make_unique<Adam>(std::move(params), adam);
}

// A distinct in-graph RNG stream per step, so dropout masks after a resume are the same as in
// an uninterrupted run.
uint64_t step_seed(uint64_t seed, int64_t step) {
  return seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(step) * 0xbf58476d1ce4e5b9ull + 1;
}

}  // namespace

DType compute_dtype(const TrainOptions& options) {
  return options.precision == "bf16" ? DType::kBF16 : DType::kF32;
}

std::string precision_summary(const TrainOptions& options) {
  if (use_bf16()) return "bf16 everywhere (XLA_SPAWN_USE_BF16=1; host reads and checkpoints f32)";
  if (options.precision == "f32") return "f32";
  const std::string exchange =
      xm::world_size() == 1            ? "no gradient exchange (1 replica)"
      : xm::bf16_exchange_enabled()    ? "gradients exchanged in bf16"
                                       : "gradients exchanged in f32 (XLA_SPAWN_GRAD_EXCHANGE=f32)";
  return fmt::format("bf16 autocast (matmul and conv2d in bf16 on {}; f32 master weights), {}",
                     bf16_engine(), exchange);
}

Trainer::Trainer(TrainOptions options) : options_(std::move(options)) {
  train_data_ = load_prefix(options_.data_dir, Split::kTrain, options_.train_samples);
  test_data_ = load_prefix(options_.data_dir, Split::kTest, options_.test_samples);
  train_loader_ = make_image_loader(
      train_data_, shard_spec(*train_data_, options_.batch_size, options_.seed, true),
      kFashionMnistNormalization);
  model_ = make_model(options_.model, options_.seed);
  optimizer_ = make_optimizer(options_, model_->parameters());
  // Replicas start from the master's parameters whatever their own initialisation gave.
  xm::broadcast_parameters(model_->named_state());
  total_steps_ = options_.epochs * train_loader_->batches_per_epoch();
  fault_hook_ = FaultHook::from_env(options_.checkpoint);
  xm::check_outputs({{"--checkpoint", options_.checkpoint},
                     {"--step-timing-csv", options_.step_timing_csv, /*may_be_stream=*/true}});
}

void Trainer::resume() {
  const std::optional<Checkpoint> found = load_checkpoint_if_exists(options_.checkpoint);
  if (!found) {
    xm::master_print("no checkpoint at {}: starting from scratch", options_.checkpoint);
    return;
  }
  const Checkpoint& view = *found;
  // Before its tensors: another model or optimizer is named as such, not by what does not fit.
  for (const auto& [key, want] :
       {std::pair{"model", options_.model}, {"optimizer", options_.optimizer}}) {
    if (view.meta_string(key) != want) {
      throw InvalidArgument(fmt::format("checkpoint {} is for {} '{}', this run trains '{}'",
                                        options_.checkpoint, key, view.meta_string(key), want));
    }
  }
  xm::load(view, model_->named_state(), optimizer_.get());
  const int64_t global_batch = options_.batch_size * xm::world_size();
  if (view.meta_int("global_batch") != global_batch) {
    throw InvalidArgument(
        fmt::format("checkpoint {} was trained with global batch {}, this run uses {} "
                    "(the data order would differ)",
                    options_.checkpoint, view.meta_int("global_batch"), global_batch));
  }
  if (view.meta_int("seed") != static_cast<int64_t>(options_.seed)) {
    throw InvalidArgument(fmt::format(
        "checkpoint {} was trained with --seed {}, this run uses {} (the data order would "
        "differ)",
        options_.checkpoint, view.meta_int("seed"), options_.seed));
  }
  // A checkpoint of another training set resumes into another data order, even when its
  // batch falls inside an epoch here (older checkpoints do not say; the epoch checks below
  // are all they get).
  if (view.metadata.contains("train_samples") &&
      view.meta_int("train_samples") != train_data_->n_samples) {
    throw InvalidArgument(fmt::format(
        "checkpoint {} was trained on {} training samples, this run uses {} (--train-samples; "
        "the data order would differ)",
        options_.checkpoint, view.meta_int("train_samples"), train_data_->n_samples));
  }
  start_epoch_ = view.meta_int("epoch");
  start_batch_ = view.meta_int("batch");
  global_step_ = view.meta_int("global_step");
  const int64_t batches = train_loader_->batches_per_epoch();
  if (start_batch_ < 0 || start_batch_ >= batches) {
    throw InvalidArgument(fmt::format(
        "checkpoint {} resumes at batch {}, but an epoch here has {} batches: was it saved with "
        "another --train-samples?",
        options_.checkpoint, start_batch_, batches));
  }
  if (start_epoch_ < 0 || global_step_ != start_epoch_ * batches + start_batch_) {
    throw InvalidArgument(fmt::format(
        "checkpoint {}: step {} is not epoch {} x {} batches + batch {} (a damaged or edited "
        "file, or another --train-samples)",
        options_.checkpoint, global_step_, start_epoch_, batches, start_batch_));
  }
  xm::master_print("resumed from {}: epoch {}, batch {}, step {}", options_.checkpoint,
                   start_epoch_ + 1, start_batch_, global_step_);
}

void Trainer::save(int64_t epoch, int64_t next_batch) {
  if (options_.checkpoint.empty()) return;
  fault_hook_->before_save(global_step_);
  xm::save(options_.checkpoint, model_->named_state(), optimizer_.get(),
           {{"epoch", epoch},
            {"batch", next_batch},
            {"global_step", global_step_},
            {"global_batch", options_.batch_size * xm::world_size()},
            {"seed", static_cast<int64_t>(options_.seed)},
            {"train_samples", train_data_->n_samples},
            {"model", options_.model},
            {"optimizer", options_.optimizer}});
}

void Trainer::set_learning_rate() {
  const double factor =
      options_.schedule == "cosine" ? cosine_decay(total_steps_)(global_step_) : 1.0;
  optimizer_->set_lr(options_.lr * factor);
}

void Trainer::train_step(const xm::DeviceBatch& batch, double& loss_value) {
  runtime().manual_seed(step_seed(options_.seed, global_step_));
  set_learning_rate();
  Tensor loss;
  {
    const AutocastGuard autocast(compute_dtype(options_));
    const Tensor logits = (*model_)(batch.images);
    fault_hook_->at_forward(global_step_);
    loss = cross_entropy(logits, batch.labels, batch.mask, batch.divisor);
  }
  backward(loss);
  xm::optimizer_step(*optimizer_, model_->named_parameters());
  ++global_step_;
  ++result_.steps;
  loss_value = loss.item();  // materialised by the step: a copy, not a second graph
  xm::check_finite_loss(loss_value, global_step_);
}

}  // namespace xs::fmnist
