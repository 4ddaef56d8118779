// train_lm's pieces in-process: packed windows and bucketed documents (every target once per
// epoch, rows split by ordinal as one replica would see them), the corpus checks, the tokenizer
// and the model's refusal of a sequence longer than its position table.
#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "examples/train_lm/batches.h"
#include "examples/train_lm/corpus.h"
#include "examples/train_lm/model.h"
#include "tests/replica/temp_dir.h"

namespace xs::lm {
namespace {

// Documents of lengths 1..40 whose tokens encode (document, position), so a misplaced token
// is caught; the separator is id 0.
std::vector<std::vector<int64_t>> numbered_documents(int n) {
  std::vector<std::vector<int64_t>> docs;
  for (int d = 0; d < n; ++d) {
    std::vector<int64_t> doc;
    for (int i = 0; i < 1 + (d * 7) % 40; ++i) doc.push_back(1 + d * 64 + i);
    docs.push_back(doc);
  }
  return docs;
}

TEST(LmBatcher, PackedRowsAreConsecutiveWindowsAndTargetsAreTheNextToken) {
  const auto docs = numbered_documents(50);
  LmBatcher b(docs, 0, {.context = 16, .batch = 3, .buckets = {}, .seed = 1});
  std::vector<int64_t> stream{0};
  for (const auto& d : docs) stream.insert(stream.end(), d.begin(), d.end()), stream.push_back(0);
  std::set<int64_t> starts;
  for (int64_t i = 0; i < b.batches_per_epoch(); ++i) {
    const TokenBatch t = b.batch(0, i);
    ASSERT_EQ(t.length, 16);
    EXPECT_EQ(t.global_targets, 3 * 16);
    for (int64_t r = 0; r < t.rows; ++r) {
      const auto at = std::search(stream.begin(), stream.end(), t.inputs.begin() + r * 16,
                                  t.inputs.begin() + (r + 1) * 16);
      ASSERT_NE(at, stream.end());
      const int64_t s = at - stream.begin();
      EXPECT_EQ(s % 16, 0) << "windows start at multiples of the context";
      EXPECT_TRUE(starts.insert(s).second) << "window " << s << " twice in an epoch";
      for (int64_t j = 0; j < 16; ++j) EXPECT_EQ(t.targets[r * 16 + j], stream[s + j + 1]);
    }
  }
  EXPECT_EQ(static_cast<int64_t>(starts.size()), b.batches_per_epoch() * 3);
}

class LmBatcherSplit : public ::testing::TestWithParam<bool> {};

// N replicas at batch B/N see, together, exactly the rows one replica sees at batch B.
TEST_P(LmBatcherSplit, TwoReplicasTogetherSeeWhatOneSees) {
  const bool pack = GetParam();
  const auto docs = numbered_documents(90);
  const BatcherOptions one{.context = 16, .batch = 8, .pack = pack, .buckets = {4, 8, 16}, .seed = 5};
  BatcherOptions half = one;
  half.batch = 4, half.world_size = 2;
  LmBatcher whole(docs, 0, one);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    for (int64_t i = 0; i < whole.batches_per_epoch(); ++i) {
      const TokenBatch w = whole.batch(epoch, i);
      for (int64_t ordinal = 0; ordinal < 2; ++ordinal) {
        half.ordinal = ordinal;
        const TokenBatch h = LmBatcher(docs, 0, half).batch(epoch, i);
        ASSERT_EQ(h.length, w.length);
        EXPECT_EQ(h.global_targets, w.global_targets);
        const size_t n = h.inputs.size();
        EXPECT_TRUE(std::equal(h.inputs.begin(), h.inputs.end(), w.inputs.begin() + ordinal * n));
        EXPECT_TRUE(std::equal(h.weights.begin(), h.weights.end(), w.weights.begin() + ordinal * n));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, LmBatcherSplit, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Pack" : "Docs"; });

TEST(LmBatcher, BucketedDocumentsUseOnlyBucketLengthsAndCountEveryTargetOnce) {
  const auto docs = numbered_documents(60);
  LmBatcher b(docs, 0, {.context = 16, .batch = 4, .pack = false, .buckets = {4, 8, 16}, .seed = 2});
  int64_t targets = 0, want = 0;
  std::set<int64_t> lengths;
  for (const auto& d : docs) want += static_cast<int64_t>(d.size()) + 1;
  for (int64_t i = 0; i < b.batches_per_epoch(); ++i) {
    const TokenBatch t = b.batch(1, i);
    lengths.insert(t.length);
    for (float w : t.weights) targets += w > 0;
  }
  EXPECT_EQ(lengths, (std::set<int64_t>{4, 8, 16}));
  EXPECT_EQ(targets, want) << "every prediction of every document once, padding weighing 0";
}

TEST(LmBatcher, WithoutBucketsEachBatchIsAsLongAsItsLongestRow) {
  const auto docs = numbered_documents(60);
  LmBatcher b(docs, 0, {.context = 64, .batch = 2, .pack = false, .buckets = {}, .seed = 2});
  std::set<int64_t> lengths;
  for (int64_t i = 0; i < b.batches_per_epoch(); ++i) {
    const TokenBatch t = b.batch(0, i);
    lengths.insert(t.length);
    int64_t longest = 0;
    for (int64_t r = 0; r < t.rows; ++r) {
      int64_t n = 0;
      for (int64_t j = 0; j < t.length; ++j) n += t.weights[r * t.length + j] > 0;
      longest = std::max(longest, n);
    }
    EXPECT_EQ(longest, t.length);
  }
  EXPECT_GT(lengths.size(), 5u) << "many lengths: what makes an unbucketed run recompile";
}

TEST(LmBatcher, RejectsBucketsThatDoNotEndAtTheContext) {
  EXPECT_THROW(LmBatcher(numbered_documents(9), 0, {.context = 16, .pack = false, .buckets = {4, 8}}),
               InvalidArgument);
}

TEST(TextCorpus, RejectsAnEmptyOrBinaryFileNamingWhy) {
  testing::TempDir dir;
  std::ofstream(dir.path("empty")) << "\n\n";
  std::ofstream(dir.path("binary"), std::ios::binary) << std::string("ELF\0\1\2 text", 12);
  try {
    load_text_corpus(dir.path("empty"));
    ADD_FAILURE() << "an empty corpus was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no text"), std::string::npos) << e.what();
  }
  try {
    load_text_corpus(dir.path("binary"));
    ADD_FAILURE() << "a binary corpus was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("binary"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_text_corpus(dir.path("missing")), Error);
}

TEST(TextCorpus, KjvIsTheWholeBibleOneVerseADocumentWithoutReferences) {
  if (!std::filesystem::exists("/usr/bin/bible")) GTEST_SKIP() << "needs bible-kjv and bible-kjv-text";
  const TextCorpus kjv = load_text_corpus("kjv");
  EXPECT_EQ(kjv.documents.size(), 31102u);
  EXPECT_EQ(kjv.documents.front(), "In the beginning God created the heaven and the earth.");
  EXPECT_GT(kjv.bytes(), 4'000'000);
  const CorpusSplit split = split_corpus(kjv);
  EXPECT_NEAR(static_cast<double>(split.validation.size()) / kjv.documents.size(), 0.1, 0.03);
  EXPECT_LT(CharTokenizer::from_documents(kjv.documents).size(), 100);
}

TEST(CharTokenizer, RoundTripsAndRefusesBytesOutsideItsAlphabet) {
  testing::TempDir dir;
  const CharTokenizer tok = CharTokenizer::from_documents({"abc", "cab d"});
  EXPECT_EQ(tok.size(), 6) << "a b c d, space and the separator";
  EXPECT_EQ(tok.decode(tok.encode("bad cab")), "bad cab");
  EXPECT_THROW(tok.encode("abz"), InvalidArgument);
  tok.save(dir.path("v"));
  EXPECT_EQ(CharTokenizer::load(dir.path("v")).alphabet(), tok.alphabet());
}

TEST(Gpt, RefusesASequenceLongerThanItsPositionTable) {
  Gpt model(GptConfig{.vocab = 5, .layers = 1, .d_model = 8, .heads = 2, .context = 4}, 0);
  EXPECT_EQ(model(Tensor::from_vector<int64_t>(std::vector<int64_t>(8, 1), {2, 4})).shape(), (Shape{8, 5}));
  try {
    model(Tensor::from_vector<int64_t>(std::vector<int64_t>(5, 1), {1, 5}));
    ADD_FAILURE() << "a 5-token sequence passed a 4-position model";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("longer than the 4 positions"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace xs::lm
