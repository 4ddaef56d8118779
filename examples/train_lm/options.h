#pragma once
// Command-line options of train_lm, validated where they enter: a bad value is an
// xs::InvalidArgument naming the flag and what it expects.
//
//   const LmOptions opt = parse_lm_options(argc, argv);   // opt.help: print opt.usage

#include <cstdint>
#include <string>
#include <vector>

namespace xs::lm {

struct LmOptions {
  std::string corpus = "kjv";   // "kjv" (Debian's bible-kjv) or a text file, a document per line
  std::string batching = "pack";  // pack | docs
  std::vector<int64_t> buckets = {32, 64, 128};  // docs: row lengths; empty (--buckets none): pad per batch
  int64_t context = 128;
  int64_t layers = 4, d_model = 128, heads = 4;
  double dropout = 0;
  int64_t batch_size = 32;  // sequences per replica
  int64_t steps = 2000;     // the schedule's length
  int64_t max_steps = 0;    // stop (with a checkpoint) at this global step; 0: at --steps
  double lr = 1e-3, min_lr_factor = 0.1, weight_decay = 0.1, beta2 = 0.99, clip = 1.0;
  int64_t warmup = 100;
  uint64_t seed = 0;
  std::string checkpoint;        // "" = none; the vocabulary goes to <checkpoint>.vocab
  int64_t checkpoint_every = 0;  // steps between checkpoints (0: at the end and each epoch)
  bool resume = false;
  int64_t eval_every = 0;     // steps between validations (0: each epoch and at the end)
  int64_t eval_batches = 0;   // 0 = the whole validation split
  int64_t sample_chars = 300;  // printed by the master at the end (0: none)
  double temperature = 0.8;
  bool metrics = false;
  std::string step_timing_csv;
  bool help = false;
  std::string usage;
};

LmOptions parse_lm_options(int argc, const char* const* argv);

}  // namespace xs::lm
