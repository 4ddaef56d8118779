// Replays the rendezvous fuzz target's fixed corpus (fuzz/corpus/rendezvous, written by
// fuzz/make_corpus.py with a second implementation of the wire format) through the body
// libFuzzer runs: ok-* streams must decode frame by frame, re-encode to the same bytes and
// drive the coordinator without breaking an invariant; bad-* must be refused with a
// ProtocolError. Every bit flip and single-byte deletion of the accepted seeds stands in for
// fuzzing in CTest.

#include <gtest/gtest.h>

#include "fuzz/rendezvous_target.h"
#include "tests/support/fuzz_corpus.h"

namespace xs {
namespace {

std::vector<testing::CorpusFile> corpus() {
  return testing::fuzz_corpus(XS_FUZZ_CORPUS_DIR, "rendezvous");
}

TEST(RendezvousCorpus, SeedsAreAcceptedOrRejectedAsNamed) {
  const auto files = corpus();
  ASSERT_GE(files.size(), 19u);
  for (const auto& f : files) {
    SCOPED_TRACE(f.name);
    bool accepted = false;
    ASSERT_NO_THROW(accepted = fuzz::rendezvous_one_input(f.bytes.data(), f.bytes.size()));
    EXPECT_EQ(accepted, f.expected_ok());
  }
}

TEST(RendezvousCorpus, EveryBitFlipAndDeletionOfTheSeedsIsHandled) {
  for (const auto& f : corpus()) {
    if (!f.expected_ok()) continue;
    std::vector<uint8_t> bytes = f.bytes;
    for (size_t i = 0; i < bytes.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        bytes[i] ^= static_cast<uint8_t>(1u << bit);
        ASSERT_NO_THROW(fuzz::rendezvous_one_input(bytes.data(), bytes.size()))
            << f.name << " byte " << i << " bit " << bit;
        bytes[i] ^= static_cast<uint8_t>(1u << bit);
      }
      std::vector<uint8_t> shorter = bytes;
      shorter.erase(shorter.begin() + static_cast<std::ptrdiff_t>(i));
      ASSERT_NO_THROW(fuzz::rendezvous_one_input(shorter.data(), shorter.size()))
          << f.name << " without byte " << i;
    }
  }
}

}  // namespace
}  // namespace xs
