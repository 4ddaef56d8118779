// Replays the fuzz targets' fixed corpus (fuzz/corpus, written by fuzz/make_corpus.py) with
// the same target bodies libFuzzer runs: ok-* files must be accepted, bad-* rejected with
// xs::InvalidArgument, and no input may escape with anything but xs::Error. A deterministic
// sweep of every single-bit flip of the valid seeds stands in for fuzzing in CTest.

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fuzz/targets.h"
#include "tests/support/fuzz_corpus.h"

namespace xs {
namespace {


using testing::CorpusFile;

std::vector<CorpusFile> corpus(const std::string& target) {
  return testing::fuzz_corpus(XS_FUZZ_CORPUS_DIR, target);
}

bool expected_ok(const CorpusFile& f) {
  return f.name.starts_with("ok-");
}

TEST(FuzzCorpus, IdxSeedsAreAcceptedOrRejectedAsNamed) {
  const auto files = corpus("idx");
  ASSERT_GE(files.size(), 10u);
  for (const CorpusFile& f : files) {
    SCOPED_TRACE(f.name);
    EXPECT_NO_THROW(fuzz::idx_one_input(f.bytes.data(), f.bytes.size()));
    if (expected_ok(f)) {
      EXPECT_NO_THROW(decode_idx(f.bytes, f.name, fuzz::kFuzzMaxBytes));
    } else {
      EXPECT_THROW(decode_idx(f.bytes, f.name, fuzz::kFuzzMaxBytes), InvalidArgument);
    }
  }
}

TEST(FuzzCorpus, CheckpointSeedsAreAcceptedOrRejectedAsNamed) {
  const auto files = corpus("checkpoint");
  ASSERT_GE(files.size(), 6u);
  for (const CorpusFile& f : files) {
    SCOPED_TRACE(f.name);
    EXPECT_NO_THROW(fuzz::checkpoint_one_input(f.bytes.data(), f.bytes.size()));
    if (expected_ok(f)) {
      EXPECT_NO_THROW(parse_checkpoint(f.bytes, f.name));
    } else {
      EXPECT_THROW(parse_checkpoint(f.bytes, f.name), InvalidArgument);
    }
  }
}

// The Python writer in make_corpus.py and the C++ writer produce the same bytes.
TEST(FuzzCorpus, IndependentWriterAgreesWithSerializeCheckpoint) {
  for (const CorpusFile& f : corpus("checkpoint")) {
    if (!expected_ok(f)) continue;
    SCOPED_TRACE(f.name);
    const Checkpoint ckpt = parse_checkpoint(f.bytes, f.name);
    std::vector<TensorRef> refs;
    for (const HostTensor& t : ckpt.tensors) refs.push_back(t.ref());
    EXPECT_EQ(serialize_checkpoint(refs, ckpt.metadata), f.bytes);
  }
}

template <typename Target>
void sweep_bit_flips(const std::vector<CorpusFile>& files, Target target) {
  for (const CorpusFile& f : files) {
    if (!expected_ok(f)) continue;
    std::vector<uint8_t> bytes = f.bytes;
    for (size_t i = 0; i < bytes.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        bytes[i] ^= static_cast<uint8_t>(1u << bit);
        ASSERT_NO_THROW(target(bytes.data(), bytes.size()))
            << f.name << " byte " << i << " bit " << bit;
        bytes[i] ^= static_cast<uint8_t>(1u << bit);
      }
    }
  }
}

TEST(FuzzCorpus, EveryBitFlipOfTheIdxSeedsIsHandled) {
  sweep_bit_flips(corpus("idx"), fuzz::idx_one_input);
}

TEST(FuzzCorpus, EveryBitFlipOfTheCheckpointSeedsIsHandled) {
  sweep_bit_flips(corpus("checkpoint"), fuzz::checkpoint_one_input);
}

}  // namespace
}  // namespace xs
