// Replays the command-line and environment fuzz targets' fixed corpus (fuzz/corpus/
// spawn_options and replica_env, written by fuzz/make_corpus.py) through the same target
// bodies libFuzzer runs: ok-* inputs must be accepted, bad-* rejected with a message, and no
// input may break an invariant or escape with anything else. Every single-byte deletion and
// every bit flip of the accepted seeds stands in for fuzzing in CTest.

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fuzz/replica_env_target.h"
#include "fuzz/spawn_options_target.h"
#include "tests/support/fuzz_corpus.h"
#include "tests/support/scoped_env.h"

namespace xs {
namespace {


using testing::CorpusFile;

std::vector<CorpusFile> corpus(const std::string& target) {
  return testing::fuzz_corpus(XS_FUZZ_CORPUS_DIR, target);
}

// The replica_env target sets and unsets the contract's variables: put them back afterwards,
// so the other tests in this process (and a run under xla-spawn) see what they had.
class EnvRestored : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : fuzz::kEnvVars) {
      const char* value = std::getenv(name);
      saved_.push_back(std::make_unique<testing::ScopedEnv>(
          name, value ? std::optional<std::string>(value) : std::nullopt));
    }
  }
  std::vector<std::unique_ptr<testing::ScopedEnv>> saved_;
};

template <typename Target>
void expect_as_named(const std::vector<CorpusFile>& files, Target target) {
  for (const CorpusFile& f : files) {
    SCOPED_TRACE(f.name);
    bool accepted = false;
    ASSERT_NO_THROW(accepted = target(f.bytes.data(), f.bytes.size()));
    EXPECT_EQ(accepted, f.name.starts_with("ok-"));
  }
}

// Every bit flip and every single-byte deletion of the accepted seeds: handled (accepted
// with the invariants holding, or rejected with a message), never anything else.
template <typename Target>
void sweep_mutations(const std::vector<CorpusFile>& files, Target target) {
  for (const CorpusFile& f : files) {
    if (!f.name.starts_with("ok-")) continue;
    std::vector<uint8_t> bytes = f.bytes;
    for (size_t i = 0; i < bytes.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        bytes[i] ^= static_cast<uint8_t>(1u << bit);
        ASSERT_NO_THROW(target(bytes.data(), bytes.size())) << f.name << " byte " << i << " bit "
                                                            << bit;
        bytes[i] ^= static_cast<uint8_t>(1u << bit);
      }
      std::vector<uint8_t> shorter = bytes;
      shorter.erase(shorter.begin() + static_cast<std::ptrdiff_t>(i));
      ASSERT_NO_THROW(target(shorter.data(), shorter.size())) << f.name << " without byte " << i;
    }
  }
}

TEST(SpawnOptionsCorpus, SeedsAreAcceptedOrRejectedAsNamed) {
  const auto files = corpus("spawn_options");
  ASSERT_GE(files.size(), 15u);
  expect_as_named(files, fuzz::spawn_options_one_input);
}

TEST(SpawnOptionsCorpus, EveryBitFlipAndDeletionOfTheSeedsIsHandled) {
  sweep_mutations(corpus("spawn_options"), fuzz::spawn_options_one_input);
}

TEST_F(EnvRestored, ReplicaEnvSeedsAreAcceptedOrRejectedAsNamed) {
  const auto files = corpus("replica_env");
  ASSERT_GE(files.size(), 12u);
  expect_as_named(files, fuzz::replica_env_one_input);
}

TEST_F(EnvRestored, EveryBitFlipAndDeletionOfTheReplicaEnvSeedsIsHandled) {
  sweep_mutations(corpus("replica_env"), fuzz::replica_env_one_input);
}

// The reference parsers the env target checks against must themselves be right, or the
// fuzzer would be checking parse_int against a wrong oracle.
TEST(ReplicaEnvReference, ReferenceIntMatchesTheContract) {
  EXPECT_EQ(fuzz::reference_int("0"), 0);
  EXPECT_EQ(fuzz::reference_int("-0"), 0);
  EXPECT_EQ(fuzz::reference_int("1023"), 1023);
  EXPECT_EQ(fuzz::reference_int("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(fuzz::reference_int("-9223372036854775808"), INT64_MIN);
  for (const char* bad : {"", "-", "+1", " 1", "1 ", "1e3", "0x10", "9223372036854775808",
                          "-9223372036854775809", "--1"}) {
    EXPECT_EQ(fuzz::reference_int(bad), std::nullopt) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace xs
