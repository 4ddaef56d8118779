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

// The texts of whole lines (every piece here must be one).
Lines texts(const std::vector<LinePiece>& pieces) {
  Lines lines;
  for (const LinePiece& p : pieces) {
    EXPECT_TRUE(p.starts_line && p.ends_line) << p.text;
    lines.push_back(p.text);
  }
  return lines;
}

TEST(LineSplitterTest, CompletesLinesAcrossChunks) {
  LineSplitter splitter;
  std::vector<LinePiece> pieces;
  splitter.feed("ab", pieces);
  EXPECT_TRUE(pieces.empty());
  splitter.feed("c\nde\n\nf", pieces);
  EXPECT_EQ(texts(pieces), (Lines{"abc", "de", ""}));
  EXPECT_TRUE(splitter.has_partial());
  splitter.finish(pieces);
  EXPECT_EQ(texts(pieces), (Lines{"abc", "de", "", "f"}));
  splitter.finish(pieces);  // nothing pending: nothing added
  EXPECT_EQ(pieces.size(), 4u);
}

TEST(LineSplitterTest, EveryChunkingGivesTheSameLines) {
  const std::string text = "first line\nsecond\n\nthird one is longer\nlast";
  for (size_t chunk = 1; chunk <= text.size(); ++chunk) {
    LineSplitter splitter;
    std::vector<LinePiece> pieces;
    for (size_t at = 0; at < text.size(); at += chunk) splitter.feed(text.substr(at, chunk), pieces);
    splitter.finish(pieces);
    EXPECT_EQ(texts(pieces), (Lines{"first line", "second", "", "third one is longer", "last"}))
        << "chunk " << chunk;
  }
}

// Pieces of a line over the cap say where the line starts and ends, so that a writer can put
// it back together.
TEST(LineSplitterTest, AnOverlongLineComesInPiecesThatSayWhereItStartsAndEnds) {
  LineSplitter splitter(4);
  std::vector<LinePiece> pieces;
  splitter.feed("abcdefghij\nxy", pieces);
  EXPECT_EQ(pieces, (std::vector<LinePiece>{
                        {"abcd", true, false}, {"efgh", false, false}, {"ij", false, true}}));
  splitter.feed("zw", pieces);
  EXPECT_EQ(pieces.back(), (LinePiece{"xyzw", true, false}));
  EXPECT_TRUE(splitter.has_partial());
  splitter.finish(pieces);  // cut exactly at the cap: the end still comes
  EXPECT_EQ(pieces.back(), (LinePiece{"", false, true}));
  EXPECT_FALSE(splitter.has_partial());
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
