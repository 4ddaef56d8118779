// Line reassembly from arbitrary pipe chunks, and the replica environment builder.

#include "xla_spawn/launcher/line_splitter.h"

#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "xla_spawn/base/int_ranges.h"

#include "xla_spawn/launcher/detail/attempt.h"
#include "xla_spawn/launcher/replica_env.h"

namespace xs {
namespace {

using Lines = std::vector<std::string>;

TEST(LineSplitterTest, CompletesLinesAcrossChunks) {
  LineSplitter splitter;
  Lines lines;
  splitter.feed("ab", lines);
  EXPECT_TRUE(lines.empty());
  splitter.feed("c\nde\n\nf", lines);
  EXPECT_EQ(lines, (Lines{"abc", "de", ""}));
  EXPECT_TRUE(splitter.has_partial());
  splitter.finish(lines);
  EXPECT_EQ(lines, (Lines{"abc", "de", "", "f"}));
  splitter.finish(lines);  // nothing pending: nothing added
  EXPECT_EQ(lines.size(), 4u);
}

TEST(LineSplitterTest, EveryChunkingGivesTheSameLines) {
  const std::string text = "first line\nsecond\n\nthird one is longer\nlast";
  for (size_t chunk = 1; chunk <= text.size(); ++chunk) {
    LineSplitter splitter;
    Lines lines;
    for (size_t at = 0; at < text.size(); at += chunk) splitter.feed(text.substr(at, chunk), lines);
    splitter.finish(lines);
    EXPECT_EQ(lines, (Lines{"first line", "second", "", "third one is longer", "last"}))
        << "chunk " << chunk;
  }
}

TEST(LineSplitterTest, OverlongLineIsCutAtTheCap) {
  LineSplitter splitter(4);
  Lines lines;
  splitter.feed("abcdefghij\nxy", lines);
  EXPECT_EQ(lines, (Lines{"abcd", "efgh", "ij"}));
  splitter.feed("zw", lines);
  EXPECT_EQ(lines, (Lines{"abcd", "efgh", "ij", "xyzw"}));
}

TEST(ReplicaEnvTest, OursAndTorchrunsNamesAndExtrasLast) {
  const std::vector<EnvVar> env =
      replica_env("xs-1-00000000", {2, 2, 8, 8}, 1, {{"XLA_SPAWN_SEGMENT", "/xs-seg"}});
  std::map<std::string, std::optional<std::string>> last;
  for (const EnvVar& v : env) last[v.name] = v.value;
  EXPECT_EQ(last["XLA_SPAWN_ORDINAL"], "2");
  EXPECT_EQ(last["RANK"], "2");
  EXPECT_EQ(last["LOCAL_RANK"], "2");
  EXPECT_EQ(last["WORLD_SIZE"], "8");
  EXPECT_EQ(last["LOCAL_WORLD_SIZE"], "8");
  EXPECT_EQ(last["XLA_SPAWN_ATTEMPT"], "1");
  EXPECT_EQ(last["XLA_SPAWN_JOB_ID"], "xs-1-00000000");
  EXPECT_EQ(last["XLA_SPAWN_SEGMENT"], "/xs-seg");
  EXPECT_EQ(last["XLA_SPAWN_NODE"], "0");
  EXPECT_EQ(last["XLA_SPAWN_NNODES"], "1");
  EXPECT_EQ(last["XLA_SPAWN_MASTER_ADDR"], std::nullopt);  // an outer job's never leaks in
  EXPECT_EQ(last["TORCHELASTIC_RESTART_COUNT"], "1");
}

TEST(ReplicaEnvTest, ANodesReplicaHasItsJobOrdinalAndItsLocalOne) {
  const std::vector<EnvVar> env = replica_env("xs-1-00000000", {5, 1, 8, 4}, 0, {});
  std::map<std::string, std::optional<std::string>> last;
  for (const EnvVar& v : env) last[v.name] = v.value;
  EXPECT_EQ(last["XLA_SPAWN_ORDINAL"], "5");
  EXPECT_EQ(last["RANK"], "5");
  EXPECT_EQ(last["XLA_SPAWN_LOCAL_ORDINAL"], "1");
  EXPECT_EQ(last["LOCAL_RANK"], "1");
  EXPECT_EQ(last["WORLD_SIZE"], "8");
  EXPECT_EQ(last["LOCAL_WORLD_SIZE"], "4");
}

TEST(ReplicaEnvTest, JobIdsCarryThePidAndDiffer) {
  const std::string a = make_job_id();
  EXPECT_EQ(a.rfind("xs-" + std::to_string(::getpid()) + "-", 0), 0u) << a;
  EXPECT_NE(a, make_job_id());
}

TEST(FormatIntRangesTest, CompressesRuns) {
  EXPECT_EQ(format_int_ranges({0, 1, 2, 3, 5, 7, 8}), "0-3, 5, 7-8");
  EXPECT_EQ(format_int_ranges({4}), "4");
  EXPECT_EQ(format_int_ranges({}), "");
}

}  // namespace
}  // namespace xs
