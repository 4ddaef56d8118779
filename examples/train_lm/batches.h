#pragma once
// Batches of token sequences for the language model, the two ways a user meets documents of
// different lengths:
//   pack: the documents, each followed by the separator, are one token stream cut into
//         windows of `context` tokens; every batch is [batch, context] and every target counts.
//   docs: one document per row (a document longer than the context is cut into pieces of it),
//         padded with weight-0 targets to the smallest bucket that holds the batch's longest
//         row. Rows are grouped by bucket, so a run compiles one step graph per bucket. With no
//         buckets every batch is padded to its own longest row: a new graph per new length.
// An epoch's order is a function of (seed, epoch) alone, and a global batch of world * batch
// rows is split among replicas by ordinal, so N replicas at the same global batch see the same
// rows as one replica does, and a resumed run continues with the batch it stopped before.
//
//   LmBatcher b(train_ids, {.context = 128, .batch = 32, .buckets = {32, 64, 128}, ...});
//   for (int64_t i = 0; i < b.batches_per_epoch(); ++i) { TokenBatch t = b.batch(epoch, i); ... }

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace xs::lm {

struct BatcherOptions {
  int64_t context = 128;         // the longest row (and the window when packing)
  int64_t batch = 32;            // rows per replica
  int64_t ordinal = 0;
  int64_t world_size = 1;
  bool pack = true;              // false: one document per row
  std::vector<int64_t> buckets;  // docs mode: sorted row lengths; empty: pad to the batch's longest
  uint64_t seed = 0;
  bool shuffle = true;
  std::string split = "training";  // for messages: which part of the corpus
};

// This replica's rows of one global batch: inputs and targets [rows, length] row-major,
// weights 1 for a real target and 0 for padding, and the global batch's real target count.
struct TokenBatch {
  int64_t rows = 0, length = 0;
  std::vector<int64_t> inputs, targets;
  std::vector<float> weights;
  int64_t global_targets = 0;
};

class LmBatcher {
 public:
  // documents: token ids of each document (without separators); separator: its id.
  LmBatcher(const std::vector<std::vector<int64_t>>& documents, int64_t separator, BatcherOptions options);
  ~LmBatcher();
  int64_t batches_per_epoch() const;
  // The `index`-th global batch of `epoch`, this replica's rows of it.
  TokenBatch batch(int64_t epoch, int64_t index);

 private:
  struct Plan;
  const Plan& plan(int64_t epoch);

  BatcherOptions options_;
  std::vector<int64_t> stream_;  // pack: the whole token stream
  struct Piece {
    int64_t begin, length;  // in stream_: inputs stream_[begin, begin + length), targets one later
  };
  std::vector<Piece> pieces_;  // docs: every row candidate
  std::unique_ptr<Plan> plan_;
  int64_t batches_per_epoch_ = 0;
};

}  // namespace xs::lm
