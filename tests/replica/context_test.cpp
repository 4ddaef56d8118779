#include "xla_spawn/replica/context.h"

#include <array>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "tests/support/scoped_env.h"

namespace xs {
namespace {

namespace n = env_names;

// Clears every variable the context reads, then sets the given ones; restores all on exit.
class EnvFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {n::kOrdinal, n::kLocalOrdinal, n::kWorldSize, n::kLocalWorldSize,
                             n::kJobId, n::kSegment, n::kAttempt, n::kTorchRank,
                             n::kTorchLocalRank, n::kTorchWorldSize, n::kTorchLocalWorldSize}) {
      guards_.push_back(std::make_unique<testing::ScopedEnv>(name, std::nullopt));
    }
  }
  void set(const char* name, const char* value) {
    guards_.push_back(std::make_unique<testing::ScopedEnv>(name, value));
  }
  std::string error_of() {
    try {
      ReplicaContext::from_env();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  }

 private:
  std::vector<std::unique_ptr<testing::ScopedEnv>> guards_;
};

TEST_F(EnvFixture, StandaloneIsOrdinalZeroOfOne) {
  const auto ctx = ReplicaContext::from_env();
  EXPECT_EQ(ctx.ordinal, 0);
  EXPECT_EQ(ctx.world_size, 1);
  EXPECT_TRUE(ctx.standalone());
  EXPECT_TRUE(ctx.is_master());
}

TEST_F(EnvFixture, ReadsProjectVariables) {
  set(n::kOrdinal, "3");
  set(n::kLocalOrdinal, "3");
  set(n::kWorldSize, "4");
  set(n::kLocalWorldSize, "4");
  set(n::kJobId, "job-1");
  set(n::kSegment, "/xs-job-1");
  set(n::kAttempt, "2");
  const auto ctx = ReplicaContext::from_env();
  EXPECT_EQ(ctx.ordinal, 3);
  EXPECT_EQ(ctx.world_size, 4);
  EXPECT_EQ(ctx.local_ordinal, 3);
  EXPECT_EQ(ctx.attempt, 2);
  EXPECT_EQ(ctx.job_id, "job-1");
  EXPECT_EQ(ctx.segment_name, "/xs-job-1");
  EXPECT_FALSE(ctx.is_master());
}

TEST_F(EnvFixture, FallsBackToTorchrunVariables) {
  set(n::kTorchRank, "1");
  set(n::kTorchWorldSize, "2");
  const auto ctx = ReplicaContext::from_env();
  EXPECT_EQ(ctx.ordinal, 1);
  EXPECT_EQ(ctx.world_size, 2);
  EXPECT_EQ(ctx.local_ordinal, 1);
}

TEST_F(EnvFixture, RejectsOrdinalNotBelowWorldSize) {
  set(n::kOrdinal, "4");
  set(n::kWorldSize, "4");
  EXPECT_NE(error_of().find(n::kOrdinal), std::string::npos);
}

TEST_F(EnvFixture, RejectsNonNumbersNamingTheVariable) {
  set(n::kOrdinal, "zero");
  set(n::kWorldSize, "4");
  EXPECT_NE(error_of().find(n::kOrdinal), std::string::npos);
}

TEST_F(EnvFixture, RejectsNegativeWorldSize) {
  set(n::kOrdinal, "0");
  set(n::kWorldSize, "-2");
  EXPECT_NE(error_of().find(n::kWorldSize), std::string::npos);
}

TEST_F(EnvFixture, RejectsOrdinalWithoutWorldSize) {
  set(n::kOrdinal, "1");
  EXPECT_NE(error_of().find("must be set together"), std::string::npos);
}

TEST_F(EnvFixture, RejectsDisagreementWithTorchrun) {
  set(n::kOrdinal, "1");
  set(n::kWorldSize, "4");
  set(n::kTorchRank, "2");
  EXPECT_NE(error_of().find("disagrees"), std::string::npos);
}

TEST_F(EnvFixture, RejectsLocalOrdinalNotBelowLocalWorldSize) {
  set(n::kOrdinal, "1");
  set(n::kWorldSize, "4");
  set(n::kLocalOrdinal, "2");
  set(n::kLocalWorldSize, "2");
  EXPECT_NE(error_of().find(n::kLocalOrdinal), std::string::npos);
}

// An error names the variables the user set, torchrun's when those were given.
TEST_F(EnvFixture, ErrorsNameTheVariablesThatWereSet) {
  set(n::kTorchRank, "2");
  set(n::kTorchWorldSize, "2");
  EXPECT_EQ(error_of(), "RANK=2 must be less than WORLD_SIZE=2");
}

// A node list shorter than the node's index is refused before it is read (it was read past
// its end: valgrind saw 16 KB of invalid reads at node 4095 of 4096 with "1").
TEST_F(EnvFixture, RejectsNodeSizesShorterThanTheNodeIndexBeforeReadingThem) {
  set(n::kOrdinal, "4095");
  set(n::kWorldSize, "4096");
  set(n::kLocalOrdinal, "0");
  set(n::kLocalWorldSize, "1");
  set(n::kNnodes, "4096");
  set(n::kNode, "4095");
  set(n::kNodeSizes, "1");
  set(n::kMasterAddr, "127.0.0.1");
  set(n::kMasterPort, "1");
  set(n::kHostAddr, "127.0.0.1");
  EXPECT_NE(error_of().find("XLA_SPAWN_NODE_SIZES=1 does not fit"), std::string::npos)
      << error_of();
}

}  // namespace
}  // namespace xs
