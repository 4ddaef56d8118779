#include "examples/train_lm/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/divergence_check.h"
#include "xla_spawn/replica/optimizer_step.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/replica/xm_checkpoint.h"
#include "xla_spawn/replica/xm_collectives.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/loss.h"
#include "xla_spawn/runtime/nn/generator.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs::lm {
namespace {

std::vector<std::vector<int64_t>> encode_all(const CharTokenizer& tok, const std::vector<std::string>& docs) {
  std::vector<std::vector<int64_t>> out;
  out.reserve(docs.size());
  for (const std::string& d : docs) out.push_back(tok.encode(d));
  return out;
}

Tensor token_tensor(const std::vector<int64_t>& ids, int64_t rows, int64_t length) {
  return Tensor::from_vector<int64_t>(ids, {rows, length});
}

std::string buckets_name(const LmOptions& o) {
  if (o.batching == "pack") return "pack";
  return o.buckets.empty() ? "docs:none" : fmt::format("docs:{}", fmt::join(o.buckets, ","));
}

// A distinct in-graph RNG stream per step (dropout), so a resumed run draws what an
// uninterrupted one would.
uint64_t step_seed(uint64_t seed, int64_t step) {
  return seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(step) * 0xbf58476d1ce4e5b9ull + 1;
}

}  // namespace

LmTrainer::LmTrainer(LmOptions options) : options_(std::move(options)) {
  const TextCorpus corpus = load_text_corpus(options_.corpus);
  const CorpusSplit split = split_corpus(corpus);
  tokenizer_ = CharTokenizer::from_documents(corpus.documents);
  const BatcherOptions train{.context = options_.context,
                             .batch = options_.batch_size,
                             .ordinal = xm::ordinal(),
                             .world_size = xm::world_size(),
                             .pack = options_.batching == "pack",
                             .buckets = options_.buckets,
                             .seed = options_.seed};
  batcher_ = std::make_unique<LmBatcher>(encode_all(tokenizer_, split.train), tokenizer_.separator(), train);
  BatcherOptions validation = train;
  validation.pack = true, validation.buckets = {}, validation.shuffle = false, validation.split = "validation";
  validation_ = std::make_unique<LmBatcher>(encode_all(tokenizer_, split.validation), tokenizer_.separator(),
                                            validation);
  schedule_ = warmup(options_.warmup, cosine_decay(options_.steps - options_.warmup, options_.min_lr_factor));
  model_ = std::make_unique<Gpt>(GptConfig{.vocab = tokenizer_.size(),
                                           .layers = options_.layers,
                                           .d_model = options_.d_model,
                                           .heads = options_.heads,
                                           .context = options_.context,
                                           .dropout = options_.dropout},
                                 options_.seed);
  const std::vector<Tensor> params = model_->parameters();
  optimizer_ = std::make_unique<AdamW>(
      params, AdamOptions{.lr = options_.lr, .beta2 = options_.beta2, .weight_decay = options_.weight_decay},
      decay_matrices_only(params));
  xm::broadcast_parameters(model_->named_state());
  const std::string vocab = options_.checkpoint.empty() ? "" : options_.checkpoint + ".vocab";
  xm::check_outputs({{"--checkpoint", options_.checkpoint},
                     {"the vocabulary beside the checkpoint", vocab},
                     {"--step-timing-csv", options_.step_timing_csv, /*may_be_stream=*/true}});
}

double LmTrainer::learning_rate(int64_t step) const { return options_.lr * schedule_(step); }

void LmTrainer::resume() {
  const std::optional<Checkpoint> found = load_checkpoint_if_exists(options_.checkpoint);
  if (!found) {
    xm::master_print("no checkpoint at {}: starting from scratch", options_.checkpoint);
    return;
  }
  const std::string want_model = model_->config().name();
  if (found->meta_string("model") != want_model || found->meta_string("vocab") != tokenizer_.hex()) {
    throw InvalidArgument(fmt::format(
        "checkpoint {} holds model {} over a {}-character vocabulary; this run builds {} over the {} characters "
        "of corpus {}: pass the same --corpus and model flags, or another --checkpoint",
        options_.checkpoint, found->meta_string("model"), found->meta_string("vocab").size() / 2, want_model,
        tokenizer_.size(), options_.corpus));
  }
  const int64_t global_batch = options_.batch_size * xm::world_size();
  if (found->meta_int("global_batch") != global_batch || found->meta_string("batching") != buckets_name(options_)) {
    throw InvalidArgument(fmt::format(
        "checkpoint {} was trained with global batch {} ({}), this run uses {} ({}): the data order would differ",
        options_.checkpoint, found->meta_int("global_batch"), found->meta_string("batching"), global_batch,
        buckets_name(options_)));
  }
  if (found->meta_int("seed") != static_cast<int64_t>(options_.seed)) {
    throw InvalidArgument(fmt::format(
        "checkpoint {} was trained with --seed {}, this run uses {}: the data order would differ",
        options_.checkpoint, found->meta_int("seed"), options_.seed));
  }
  global_step_ = found->meta_int("global_step");
  if (global_step_ < 0) {
    throw InvalidArgument(fmt::format("checkpoint {} is at step {} (a damaged or edited file)",
                                      options_.checkpoint, global_step_));
  }
  xm::load(*found, model_->named_state(), optimizer_.get());  // read once, checked above
  xm::master_print("resumed from {} at step {}", options_.checkpoint, global_step_);
}

void LmTrainer::save() {
  if (options_.checkpoint.empty()) return;
  if (xm::is_master()) tokenizer_.save(options_.checkpoint + ".vocab");
  xm::save(options_.checkpoint, model_->named_state(), optimizer_.get(),
           {{"global_step", global_step_},
            {"global_batch", options_.batch_size * xm::world_size()},
            {"batching", buckets_name(options_)},
            {"model", model_->config().name()},
            {"vocab", tokenizer_.hex()},
            {"seed", static_cast<int64_t>(options_.seed)}});
}

double LmTrainer::train_step(const TokenBatch& b) {
  runtime().manual_seed(step_seed(options_.seed, global_step_));
  optimizer_->set_lr(learning_rate(global_step_));
  const Tensor inputs = token_tensor(b.inputs, b.rows, b.length);
  const Tensor targets = Tensor::from_vector<int64_t>(b.targets, {b.rows * b.length});
  const Tensor weights = Tensor::from_vector<float>(b.weights, {b.rows * b.length});
  // Each replica divides by the global count over N, so the mean all-reduce of the gradients
  // is the gradient of the mean loss per target over the whole global batch.
  const Tensor divisor = Tensor::full_data(
      {}, static_cast<double>(b.global_targets) / static_cast<double>(xm::world_size()));
  const Tensor loss = cross_entropy((*model_)(inputs), targets, weights, divisor);
  backward(loss);
  xm::optimizer_step(*optimizer_, model_->named_parameters(), {.clip_grad_norm = options_.clip});
  ++global_step_;
  ++result_.steps;
  const double value = loss.item();
  xm::check_finite_loss(value, global_step_);
  return value;
}

double LmTrainer::evaluate() {
  model_->eval();
  NoGradGuard no_grad;
  int64_t n = validation_->batches_per_epoch();
  if (options_.eval_batches > 0) n = std::min(n, options_.eval_batches);
  double totals[2] = {0, 0};  // nats, targets
  for (int64_t i = 0; i < n; ++i) {
    const TokenBatch b = validation_->batch(0, i);
    const Tensor nll = cross_entropy_per_sample((*model_)(token_tensor(b.inputs, b.rows, b.length)),
                                                Tensor::from_vector<int64_t>(b.targets, {b.rows * b.length}));
    const Tensor total = sum(nll * Tensor::from_vector<float>(b.weights, {b.rows * b.length}));
    mark_step();
    totals[0] += total.item();
    for (float w : b.weights) totals[1] += w;
  }
  xm::all_reduce(std::span<double>(totals), ReduceOp::kSum);
  model_->train();
  return totals[1] > 0 ? totals[0] / totals[1] : 0.0;
}

std::string LmTrainer::sample(const std::string& prompt, int64_t chars, double temperature, uint64_t seed) {
  model_->eval();
  NoGradGuard no_grad;
  const int64_t ctx = options_.context, vocab = tokenizer_.size();
  std::vector<int64_t> ids = tokenizer_.encode("\n" + prompt);
  Generator gen(seed);
  std::string out = prompt;
  for (int64_t c = 0; c < chars; ++c) {
    const int64_t used = std::min<int64_t>(ids.size(), ctx);
    std::vector<int64_t> window(ids.end() - used, ids.end());
    window.resize(static_cast<size_t>(ctx), tokenizer_.separator());  // later positions never reach earlier ones
    const Tensor logits = (*model_)(token_tensor(window, 1, ctx));
    mark_step();
    const std::vector<double> all = logits.to_vector<double>();
    const double* row = all.data() + (used - 1) * vocab;
    const double top = *std::max_element(row, row + vocab);
    std::vector<double> p(static_cast<size_t>(vocab));
    double total = 0;
    for (int64_t v = 0; v < vocab; ++v) total += (p[v] = std::exp((row[v] - top) / temperature));
    double u = gen.uniform(0, total);
    int64_t next = vocab - 1;
    for (int64_t v = 0; v < vocab; ++v) {
      if ((u -= p[v]) < 0) {
        next = v;
        break;
      }
    }
    ids.push_back(next);
    out += tokenizer_.decode({next});
  }
  model_->train();
  return out;
}

LmResult LmTrainer::run() {
  if (options_.resume) resume();
  const int64_t per_epoch = batcher_->batches_per_epoch();
  xm::master_print("train_lm: model {} ({} parameters) on corpus {}, {} replicas x {} sequences of {}, {}, "
                   "{} batches per epoch, {} steps",
                   model_->config().name(), [&] {
                     int64_t n = 0;
                     for (const Tensor& p : model_->parameters()) n += numel(p.shape());
                     return n;
                   }(),
                   options_.corpus, xm::world_size(), options_.batch_size, options_.context,
                   buckets_name(options_), per_epoch, options_.steps);
  const int64_t report_every = std::max<int64_t>(1, options_.steps / 20);
  double tokens = 0, window_loss = 0, window_tokens = 0, window_seconds = 0;
  int64_t window_steps = 0;
  auto validate = [&](const char* when) {
    result_.val_loss = evaluate();
    xm::master_print("step {}/{} ({}): validation loss {:.4f} nats/char, {:.4f} bits/char", global_step_,
                     options_.steps, when, result_.val_loss, result_.val_loss / std::numbers::ln2);
  };
  const int64_t stop = options_.max_steps > 0 ? std::min(options_.max_steps, options_.steps) : options_.steps;
  while (global_step_ < stop) {
    const int64_t epoch = global_step_ / per_epoch, index = global_step_ % per_epoch;
    timer_.begin();
    const TokenBatch batch = batcher_->batch(epoch, index);
    timer_.data_ready();
    const auto start = std::chrono::steady_clock::now();
    result_.last_loss = train_step(batch);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    timer_.end(epoch, index);
    result_.train_seconds += seconds;
    tokens += static_cast<double>(batch.global_targets);
    window_loss += result_.last_loss, window_tokens += static_cast<double>(batch.global_targets);
    window_seconds += seconds, ++window_steps;
    if (global_step_ % report_every == 0 || global_step_ == stop) {
      xm::master_print("step {}/{}: loss {:.4f}, lr {:.2e}, {:.0f} tokens/s", global_step_, options_.steps,
                       window_loss / window_steps, learning_rate(global_step_ - 1), window_tokens / window_seconds);
      window_loss = window_tokens = window_seconds = 0, window_steps = 0;
    }
    const bool epoch_end = global_step_ % per_epoch == 0;
    if (epoch_end && global_step_ < options_.steps && options_.eval_every == 0) validate("end of epoch");
    if (options_.eval_every > 0 && global_step_ % options_.eval_every == 0 && global_step_ < options_.steps) {
      validate("periodic");
    }
    if ((options_.checkpoint_every > 0 && global_step_ % options_.checkpoint_every == 0) || epoch_end) save();
  }
  validate("end of training");
  save();
  result_.tokens_per_second = result_.train_seconds > 0 ? tokens / result_.train_seconds : 0;
  if (options_.sample_chars > 0 && xm::is_master()) {
    result_.sample = sample("", options_.sample_chars, options_.temperature, options_.seed);
  }
  if (!options_.step_timing_csv.empty()) timer_.write_csv(options_.step_timing_csv);
  return result_;
}

}  // namespace xs::lm
