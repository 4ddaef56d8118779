// The job's shape (NodeTopology) and how the hierarchical collectives divide a buffer (node
// cuts, pieces and their groups), as pure functions: awkward node sizes, counts and element
// sizes, every piece checked against every node's cut.
#include <gtest/gtest.h>

#include <set>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/detail/node_groups.h"
#include "xla_spawn/collectives/detail/node_pieces.h"
#include "xla_spawn/collectives/node_topology.h"

namespace xs::detail {
namespace {

const std::vector<std::vector<int>> kShapes = {
    {1}, {1, 1}, {2, 2}, {1, 2, 1}, {2, 1}, {3, 1, 2}, {7, 5, 1024, 3}, {8, 8, 8}, {1000, 999}};
const std::vector<size_t> kCounts = {0, 1, 7, 15, 16, 17, 63, 64, 65, 1023, 65536 + 17, 1'000'003};
const size_t kElemBytes[] = {1, 2, 4, 8};

std::string where(const std::vector<int>& sizes, size_t n, size_t elem_bytes) {
  return fmt::format("sizes {} n={} elem_bytes={}", fmt::join(sizes, ","), n, elem_bytes);
}

TEST(NodeTopologyTest, OrdinalsAreDenseAndOrderedByNode) {
  const NodeTopology t({2, 1, 3}, 2, 1);
  EXPECT_EQ(t.nnodes(), 3);
  EXPECT_EQ(t.world_size(), 6);
  EXPECT_EQ(t.ordinal(), 4);
  EXPECT_EQ(t.local_world_size(), 3);
  EXPECT_EQ(t.first_ordinal(0), 0);
  EXPECT_EQ(t.first_ordinal(1), 2);
  EXPECT_EQ(t.first_ordinal(2), 3);
  const int nodes[] = {0, 0, 1, 2, 2, 2};
  for (int o = 0; o < 6; ++o) EXPECT_EQ(t.node_of(o), nodes[o]) << "ordinal " << o;
  EXPECT_THROW(t.node_of(6), InvalidArgument);
  EXPECT_THROW(t.node_of(-1), InvalidArgument);
}

TEST(NodeTopologyTest, RejectsBadShapesNamingTheValues) {
  auto message = [](std::vector<int> sizes, int node, int local) -> std::string {
    try {
      NodeTopology(std::move(sizes), node, local);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message({}, 0, 0).find("0 nodes"), std::string::npos);
  EXPECT_NE(message({2, 0}, 0, 0).find("node 1 has 0 replicas"), std::string::npos);
  EXPECT_NE(message({1025}, 0, 0).find("1025"), std::string::npos);
  EXPECT_NE(message({2, 2}, 2, 0).find("node 2 outside 0..1"), std::string::npos);
  EXPECT_NE(message({2, 3}, 1, 3).find("local ordinal 3 outside 0..2"), std::string::npos);
  EXPECT_NE(message({2, 3}, 0, -1).find("local ordinal -1"), std::string::npos);
}

TEST(NodeCutTest, BoundsRunFrom0ToNOnWholeCacheLines) {
  for (int size : {1, 2, 3, 5, 7, 64, 1000, 1024}) {
    for (size_t n : kCounts) {
      for (size_t elem_bytes : kElemBytes) {
        const std::vector<size_t> cut = node_cut(n, size, elem_bytes);
        const size_t line = 64 / elem_bytes;
        ASSERT_EQ(cut.size(), static_cast<size_t>(size) + 1);
        EXPECT_EQ(cut.front(), 0u);
        EXPECT_EQ(cut.back(), n);
        for (int l = 1; l <= size; ++l) {
          EXPECT_LE(cut[l - 1], cut[l]) << "L=" << size << " n=" << n << " l=" << l;
          EXPECT_TRUE(cut[l] == n || cut[l] % line == 0) << "L=" << size << " n=" << n;
          if (cut[l - 1] < cut[l]) {  // a non-empty range holds its first element
            EXPECT_EQ(range_holding(cut[l - 1], n, size, elem_bytes), l - 1)
                << "L=" << size << " n=" << n << " l=" << l;
          }
        }
      }
    }
  }
}

TEST(NodeCutTest, RangesAreNearlyEvenForLargeCounts) {
  const std::vector<size_t> cut = node_cut(1'000'000, 3, 4);
  for (int l = 0; l < 3; ++l) EXPECT_NEAR(cut[l + 1] - cut[l], 333'333.0, 16.0) << "range " << l;
}

// The defining properties of the pieces: they tile [0, n); a piece's holder on node h is the
// range of h's cut that contains it; every cut point starts a piece.
TEST(PiecesTest, PiecesTileTheBufferAndLieInTheirHoldersRanges) {
  for (const std::vector<int>& sizes : kShapes) {
    for (size_t n : kCounts) {
      for (size_t elem_bytes : kElemBytes) {
        const std::vector<CutPiece> pieces = all_pieces(n, elem_bytes, sizes);
        std::vector<std::vector<size_t>> cuts;
        for (int size : sizes) cuts.push_back(node_cut(n, size, elem_bytes));
        std::set<size_t> starts;
        size_t at = 0;
        for (const CutPiece& p : pieces) {
          ASSERT_EQ(p.offset, at) << where(sizes, n, elem_bytes);
          ASSERT_GT(p.count, 0u) << where(sizes, n, elem_bytes);
          ASSERT_EQ(p.holders.size(), sizes.size());
          for (size_t h = 0; h < sizes.size(); ++h) {
            const std::vector<size_t>& cut = cuts[h];
            const int l = p.holders[h];
            ASSERT_TRUE(cut[l] <= p.offset && p.offset + p.count <= cut[l + 1])
                << where(sizes, n, elem_bytes) << " piece at " << p.offset << " node " << h;
          }
          starts.insert(p.offset);
          at += p.count;
        }
        EXPECT_EQ(at, n) << where(sizes, n, elem_bytes);
        for (const std::vector<size_t>& cut : cuts) {
          for (size_t point : cut) {
            EXPECT_TRUE(point == n || starts.count(point)) << where(sizes, n, elem_bytes);
          }
        }
      }
    }
  }
}

// pieces_of only looks at the cut points inside one range; it must agree with the whole list.
TEST(PiecesTest, EachReplicasPiecesAreThoseItHoldsInOffsetOrder) {
  for (const std::vector<int>& sizes : kShapes) {
    for (size_t n : kCounts) {
      const size_t elem_bytes = 4;
      const std::vector<CutPiece> pieces = all_pieces(n, elem_bytes, sizes);
      for (int h = 0; h < static_cast<int>(sizes.size()); ++h) {
        for (int l = 0; l < sizes[h]; ++l) {
          std::vector<CutPiece> want;
          for (const CutPiece& p : pieces) {
            if (p.holders[h] == l) want.push_back(p);
          }
          const std::vector<CutPiece> got = pieces_of(n, elem_bytes, sizes, h, l);
          ASSERT_EQ(got.size(), want.size())
              << where(sizes, n, elem_bytes) << " (" << h << ", " << l << ")";
          for (size_t i = 0; i < got.size(); ++i) {
            EXPECT_EQ(got[i].offset, want[i].offset);
            EXPECT_EQ(got[i].count, want[i].count);
            EXPECT_EQ(got[i].holders, want[i].holders);
          }
        }
      }
    }
  }
}

TEST(PiecesTest, EqualNodesGroupTheSameLocalOrdinalEverywhere) {
  for (size_t n : kCounts) {
    const std::vector<int> sizes = {4, 4, 4};
    const std::vector<CutPiece> pieces = all_pieces(n, 4, sizes);
    for (const CutPiece& p : pieces) {
      EXPECT_EQ(p.holders, std::vector<int>(3, p.holders[0])) << "n=" << n << " at " << p.offset;
    }
    EXPECT_LE(pieces.size(), 4u);
  }
}

// Reduce-scatter cuts also at the node blocks, so that each piece has one destination node.
TEST(PiecesTest, ExtraCutsSplitPiecesAtBlockBoundaries) {
  const std::vector<int> sizes = {3, 1, 2};
  for (size_t chunk : {1, 7, 1023, 5000}) {
    const size_t total = chunk * 6;
    const std::vector<size_t> blocks = {3 * chunk, 4 * chunk};
    for (int h = 0; h < 3; ++h) {
      for (int l = 0; l < sizes[h]; ++l) {
        for (const CutPiece& p : pieces_of(total, 8, sizes, h, l, blocks)) {
          const size_t last = p.offset + p.count - 1;
          const auto block_of = [&](size_t i) { return i < blocks[0] ? 0 : i < blocks[1] ? 1 : 2; };
          EXPECT_EQ(block_of(p.offset), block_of(last)) << "chunk " << chunk << " at " << p.offset;
        }
      }
    }
  }
}

TEST(GroupKeyTest, IsSixteenHexDigitsAndTellsGroupsApart) {
  std::set<std::string> keys;
  for (const std::vector<int>& holders :
       std::vector<std::vector<int>>{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {0, 0, 0}, {0}}) {
    const std::string key = group_key(holders);
    EXPECT_EQ(key.size(), 16u);
    EXPECT_EQ(key.find_first_not_of("0123456789abcdef"), std::string::npos) << key;
    keys.insert(key);
  }
  EXPECT_EQ(keys.size(), 6u);
  const std::vector<int> wide(1000, 3);
  EXPECT_EQ(group_key(wide), group_key(std::vector<int>(1000, 3)));
}

}  // namespace
}  // namespace xs::detail
