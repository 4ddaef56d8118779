#include "examples/train_lm/batches.h"

#include <algorithm>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/base/splitmix64.h"

namespace xs::lm {

// One epoch: each global batch is a row length and world * batch piece indices (-1: a padding
// row, only in the last batch of a bucket).
struct LmBatcher::Plan {
  int64_t epoch = -1;
  std::vector<int64_t> lengths;
  std::vector<std::vector<int64_t>> rows;
};

namespace {

template <typename T>
void shuffle(std::vector<T>& v, SplitMix64& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

}  // namespace

LmBatcher::LmBatcher(const std::vector<std::vector<int64_t>>& documents, int64_t separator,
                     BatcherOptions options)
    : options_(std::move(options)) {
  const BatcherOptions& o = options_;
  if (o.context < 1 || o.batch < 1 || o.world_size < 1 || o.ordinal < 0 || o.ordinal >= o.world_size) {
    throw InvalidArgument(fmt::format("LmBatcher: context {}, batch {}, ordinal {} of {}", o.context, o.batch,
                                      o.ordinal, o.world_size));
  }
  if (!std::is_sorted(o.buckets.begin(), o.buckets.end()) ||
      (!o.buckets.empty() && (o.buckets.front() < 1 || o.buckets.back() != o.context))) {
    throw InvalidArgument(fmt::format("LmBatcher: buckets must be ascending and end at the context {}", o.context));
  }
  // The stream: separator, document, separator, document, ..., separator.
  stream_.push_back(separator);
  std::vector<int64_t> starts;  // of each document's leading separator
  for (const std::vector<int64_t>& d : documents) {
    starts.push_back(static_cast<int64_t>(stream_.size()) - 1);
    stream_.insert(stream_.end(), d.begin(), d.end());
    stream_.push_back(separator);
  }
  if (o.pack) {
    for (int64_t b = 0; b + o.context < static_cast<int64_t>(stream_.size()); b += o.context) {
      pieces_.push_back({b, o.context});
    }
  } else {
    // A document of L tokens is L + 1 predictions (its first token after the separator, ...,
    // the separator after its last token), cut into rows of at most `context`.
    for (size_t i = 0; i < documents.size(); ++i) {
      const int64_t predictions = static_cast<int64_t>(documents[i].size()) + 1;
      for (int64_t at = 0; at < predictions; at += o.context) {
        pieces_.push_back({starts[i] + at, std::min(o.context, predictions - at)});
      }
    }
  }
  if (static_cast<int64_t>(pieces_.size()) < (o.pack ? o.batch * o.world_size : 1)) {
    throw InvalidArgument(fmt::format(
        "the corpus's {} split: {} tokens make {} rows of {}, fewer than one global batch of {} (a larger "
        "corpus, or a smaller --batch-size or --context)",
        o.split, stream_.size(), pieces_.size(), o.context, o.batch * o.world_size));
  }
  // Every epoch has as many batches (bucket sizes do not depend on the order).
  batches_per_epoch_ = static_cast<int64_t>(plan(0).rows.size());
}

LmBatcher::~LmBatcher() = default;

const LmBatcher::Plan& LmBatcher::plan(int64_t epoch) {
  if (plan_ && plan_->epoch == epoch) return *plan_;
  const BatcherOptions& o = options_;
  const int64_t global = o.batch * o.world_size;
  SplitMix64 rng(splitmix64_finalize(o.seed * kSplitMix64Increment + static_cast<uint64_t>(epoch) + 1));
  std::vector<int64_t> order(pieces_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  if (o.shuffle) shuffle(order, rng);

  auto plan = std::make_unique<Plan>();
  plan->epoch = epoch;
  const std::vector<int64_t> buckets = o.pack ? std::vector<int64_t>{o.context} : o.buckets;
  if (buckets.empty()) {  // each batch as long as its longest row
    for (size_t at = 0; at < order.size(); at += static_cast<size_t>(global)) {
      std::vector<int64_t> rows(order.begin() + static_cast<ptrdiff_t>(at),
                                order.begin() + static_cast<ptrdiff_t>(std::min(order.size(), at + global)));
      int64_t longest = 0;
      for (int64_t p : rows) longest = std::max(longest, pieces_[p].length);
      rows.resize(static_cast<size_t>(global), -1);
      plan->lengths.push_back(longest);
      plan->rows.push_back(std::move(rows));
    }
  } else {
    std::vector<std::vector<int64_t>> by_bucket(buckets.size());
    for (int64_t p : order) {
      const size_t b = std::lower_bound(buckets.begin(), buckets.end(), pieces_[p].length) - buckets.begin();
      by_bucket[b].push_back(p);
    }
    std::vector<std::pair<int64_t, std::vector<int64_t>>> batches;
    for (size_t b = 0; b < buckets.size(); ++b) {
      const std::vector<int64_t>& in = by_bucket[b];
      // Packed windows drop a partial last batch (every target counts); documents pad it.
      const size_t end = o.pack ? in.size() / global * global : in.size();
      for (size_t at = 0; at < end; at += static_cast<size_t>(global)) {
        std::vector<int64_t> rows(in.begin() + static_cast<ptrdiff_t>(at),
                                  in.begin() + static_cast<ptrdiff_t>(std::min(end, at + global)));
        rows.resize(static_cast<size_t>(global), -1);
        batches.emplace_back(buckets[b], std::move(rows));
      }
    }
    if (o.shuffle) shuffle(batches, rng);
    for (auto& [length, rows] : batches) {
      plan->lengths.push_back(length);
      plan->rows.push_back(std::move(rows));
    }
  }
  plan_ = std::move(plan);
  return *plan_;
}

int64_t LmBatcher::batches_per_epoch() const { return batches_per_epoch_; }

TokenBatch LmBatcher::batch(int64_t epoch, int64_t index) {
  const Plan& p = plan(epoch);
  XS_CHECK(index >= 0 && index < static_cast<int64_t>(p.rows.size()), "LmBatcher: batch {} of {}", index,
           p.rows.size());
  const std::vector<int64_t>& rows = p.rows[static_cast<size_t>(index)];
  TokenBatch t;
  t.rows = options_.batch;
  t.length = p.lengths[static_cast<size_t>(index)];
  const size_t n = static_cast<size_t>(t.rows * t.length);
  const int64_t pad = stream_.front();  // the separator: any valid id; its targets weigh 0
  t.inputs.assign(n, pad);
  t.targets.assign(n, pad);
  t.weights.assign(n, 0.0f);
  for (int64_t r : rows) t.global_targets += r < 0 ? 0 : pieces_[r].length;
  for (int64_t i = 0; i < t.rows; ++i) {
    const int64_t r = rows[static_cast<size_t>(options_.ordinal * t.rows + i)];
    if (r < 0) continue;
    const Piece& piece = pieces_[r];
    for (int64_t j = 0; j < piece.length; ++j) {
      t.inputs[i * t.length + j] = stream_[piece.begin + j];
      t.targets[i * t.length + j] = stream_[piece.begin + j + 1];
      t.weights[i * t.length + j] = 1.0f;
    }
  }
  return t;
}

}  // namespace xs::lm
