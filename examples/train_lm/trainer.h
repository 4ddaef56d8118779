#pragma once
// The training loop of train_lm: a character-level GPT on a text corpus with AdamW, warm-up and
// cosine decay, in-graph gradient clipping, one compiled step per batch shape; validation loss
// and bits per character (sharded over the replicas); atomic checkpoints with the vocabulary
// beside them and resuming at the exact step; a sample from the trained model at the end.
//
//   xs::xm::init();
//   xs::lm::LmTrainer trainer(options);
//   xs::lm::LmResult r = trainer.run();

#include <cstdint>
#include <memory>
#include <string>

#include "examples/train_lm/batches.h"
#include "examples/train_lm/corpus.h"
#include "examples/train_lm/model.h"
#include "examples/train_lm/options.h"
#include "xla_spawn/replica/step_timing.h"
#include "xla_spawn/runtime/optim/adam.h"
#include "xla_spawn/runtime/optim/lr_schedule.h"

namespace xs::lm {

struct LmResult {
  int64_t steps = 0;             // optimizer steps run by this process (not counting resumed ones)
  double train_seconds = 0;      // wall time of training steps
  double tokens_per_second = 0;  // global predicted tokens per second of training
  double last_loss = 0;          // training loss of the last step
  double val_loss = -1;          // nats per character of the last validation; -1: none ran
  std::string sample;            // generated text (master only)
};

class LmTrainer {
 public:
  explicit LmTrainer(LmOptions options);
  LmResult run();
  // Mean loss per character over the validation split (collective: every replica calls it).
  double evaluate();
  // `chars` characters generated after `prompt` at `temperature` from a fixed [1, context]
  // window (one graph however long the text grows), drawn from a seeded host generator.
  std::string sample(const std::string& prompt, int64_t chars, double temperature, uint64_t seed);
  Gpt& model() { return *model_; }
  const CharTokenizer& tokenizer() const { return tokenizer_; }
  int64_t batches_per_epoch() const { return batcher_->batches_per_epoch(); }

 private:
  void resume();
  double train_step(const TokenBatch& batch);
  void save();
  double learning_rate(int64_t step) const;

  LmOptions options_;
  CharTokenizer tokenizer_{"\n"};
  std::unique_ptr<LmBatcher> batcher_, validation_;  // validation: packed windows, in order
  LrFactor schedule_;
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<AdamW> optimizer_;
  int64_t global_step_ = 0;
  xm::StepTimer timer_{!options_.step_timing_csv.empty()};
  LmResult result_;
};

}  // namespace xs::lm
