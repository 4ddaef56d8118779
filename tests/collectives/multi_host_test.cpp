// MultiHostCommunicator across forked replicas grouped into nodes (multi_host_harness.h):
// every collective on topologies with equal and unequal nodes, checked against closed forms
// (test_data.h) and, for all-reduce, fingerprinted for bit-identity across every replica.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <iostream>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "tests/collectives/combination_sweep.h"
#include "tests/collectives/multi_host_harness.h"
#include "tests/collectives/test_data.h"

namespace xs::testing {
namespace {

constexpr size_t kStagingBytes = 64 << 10;  // per ordinal, in each node's segment
// Scratch beyond the sweep's fingerprints: per ordinal, contexts created and connect time.
constexpr size_t kStatsAt = 32 << 10;

std::vector<size_t> sweep_counts(DType dtype) {  // the last: more than one node's staging
  return {0, 1, 7, 1023, 65536 + 17, 5 * kStagingBytes / 4 / dtype_size(dtype) + 5};
}
const std::vector<size_t> kCounts = {0, 1, 7, 1023, 65536 + 17};

struct Stats {
  std::atomic<int64_t> contexts;
  std::atomic<int64_t> connect_us;
};
Stats* stats(std::byte* scratch, int ordinal) {
  return reinterpret_cast<Stats*>(scratch + kStatsAt) + ordinal;
}

std::string payload_of(int ordinal, int round) {  // ordinal 0's is empty
  return std::string(static_cast<size_t>(ordinal * 1237 * (round + 1)) % 3001,
                     static_cast<char>('a' + ordinal));
}

std::string topology_name(const ::testing::TestParamInfo<std::vector<int>>& info) {
  return fmt::format("Nodes{}", fmt::join(info.param, "_"));
}

class MultiHostTest : public ::testing::TestWithParam<std::vector<int>> {
 protected:
  // Runs `body` on every replica; returns the job for checks of the scratch.
  void run(const MultiHostJob::Body& body, const std::function<void(const ForkJob&)>& check = {}) {
    MultiHostJob job(GetParam(), {.timeout_ms = 30'000, .prefix = {}}, kStagingBytes);
    job.start(body);
    const JobResult result = job.wait(std::chrono::seconds(60));
    EXPECT_TRUE(result.all_ok()) << result.describe();
    if (check && result.all_ok()) check(job.fork_job());
  }
  int world_size() const {
    int w = 0;
    for (int size : GetParam()) w += size;
    return w;
  }
};

// Half the calls (alternating by ordinal) pass an operand from the arena, the others one
// from the heap, which the communicator stages.
TEST_P(MultiHostTest, AllReduceMatchesClosedFormAndIsBitIdenticalOnEveryReplica) {
  const int w = world_size();
  run(
      [](Child& child, MultiHostCommunicator& comm) {
        int call = 0;
        const std::string failures =
            reduce_all_combinations(child, sweep_counts, [&](DType dtype, ReduceOp op, size_t n) {
              std::vector<std::byte> data = make_input(dtype, child.ordinal, n);
              if ((child.ordinal + call++) % 2 == 1 || n == 0) {
                comm.all_reduce(data.data(), n, dtype, op);
                return data;
              }
              void* operand = comm.alloc_buffer(data.size());
              std::memcpy(operand, data.data(), data.size());
              comm.all_reduce(operand, n, dtype, op);
              std::memcpy(data.data(), operand, data.size());
              comm.free_buffer(operand);
              return data;
            });
        stats(child.scratch, child.ordinal)->contexts = static_cast<int64_t>(comm.group_contexts());
        stats(child.scratch, child.ordinal)->connect_us =
            static_cast<int64_t>(comm.connect_seconds() * 1e6);
        return failures;
      },
      [&](const ForkJob& job) {
        expect_bit_identical(job, w, combination_count(sweep_counts));
        int64_t contexts = 0, slowest_us = 0;
        for (int o = 0; o < w; ++o) {
          contexts += stats(job.scratch(), o)->contexts;
          slowest_us = std::max<int64_t>(slowest_us, stats(job.scratch(), o)->connect_us);
        }
        std::cout << fmt::format(
            "[ stats    ] {} contexts in all; slowest replica spent {:.1f} ms in "
            "connectFullMesh\n",
            contexts, slowest_us * 1e-3);
      });
}

// Gradient-sized buffers (4-6 MB: several of gloo's 1 MiB segments per piece, ranges that do
// not divide evenly) in dtypes of three widths, from the arena as the runtime's are.
TEST_P(MultiHostTest, LargeAllReducesStayRightAndBitIdentical) {
  struct Case {
    DType dtype;
    ReduceOp op;
    size_t n;
  };
  const std::vector<Case> cases = {{DType::kF32, ReduceOp::kSum, size_t{1} << 20},
                                   {DType::kF32, ReduceOp::kMean, 3 * (size_t{1} << 19) + 7},
                                   {DType::kBF16, ReduceOp::kSum, 2 * (size_t{1} << 20) + 5},
                                   {DType::kI64, ReduceOp::kMax, 3 * (size_t{1} << 18) + 1}};
  const int w = world_size();
  run(
      [&cases](Child& child, MultiHostCommunicator& comm) {
        std::string failures;
        for (size_t c = 0; c < cases.size(); ++c) {
          const Case& k = cases[c];
          std::vector<std::byte> data = make_input(k.dtype, child.ordinal, k.n);
          void* operand = comm.alloc_buffer(data.size());
          std::memcpy(operand, data.data(), data.size());
          comm.all_reduce(operand, k.n, k.dtype, k.op);
          std::memcpy(data.data(), operand, data.size());
          comm.free_buffer(operand);
          std::string why;
          if (count_wrong(data, k.dtype, k.op, child.world_size, &why) != 0) {
            failures += fmt::format("{} {} n={}: {}; ", dtype_name(k.dtype), reduce_op_name(k.op),
                                    k.n, why);
          }
          *fingerprint_slot(child.scratch, c, child.ordinal) =
              fingerprint(data.data(), data.size());
        }
        return failures;
      },
      [&](const ForkJob& job) { expect_bit_identical(job, w, cases.size()); });
}

// With equal nodes every piece's holders are one local ordinal on every node (and local
// ordinal 0's group is also the leaders' one): one context per replica, whatever the count.
TEST(MultiHostGroupsTest, EqualNodesNeedOneGroupPerLocalOrdinal) {
  MultiHostJob job({2, 2, 2}, {.timeout_ms = 30'000, .prefix = {}}, kStagingBytes);
  job.start([](Child&, MultiHostCommunicator& comm) {
    for (size_t n : {size_t{1}, size_t{1023}, size_t{100'003}}) {
      std::vector<float> data(n, 1.0f);
      comm.all_reduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum);
      if (data[n - 1] != 6.0f) return fmt::format("n={}: {} != 6", n, data[n - 1]);
    }
    comm.barrier();
    if (comm.group_contexts() != 1) return fmt::format("{} group contexts", comm.group_contexts());
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// One node: the hierarchical schedules reduce to their local phases and never touch gloo.
TEST(MultiHostGroupsTest, ASingleNodeJobNeedsNoNetwork) {
  MultiHostJob job({3}, {.timeout_ms = 30'000, .prefix = {}}, kStagingBytes);
  job.start([](Child& child, MultiHostCommunicator& comm) {
    for (size_t n : {size_t{1}, size_t{1023}, size_t{65536 + 17}}) {
      std::vector<std::byte> data = make_input(DType::kBF16, child.ordinal, n);
      comm.all_reduce(data.data(), n, DType::kBF16, ReduceOp::kMean);
      std::string why;
      if (count_wrong(data, DType::kBF16, ReduceOp::kMean, 3, &why) != 0) return why;
      std::vector<std::byte> chunk(n * 2);
      const std::vector<std::byte> in = make_input(DType::kBF16, child.ordinal, 3 * n);
      comm.reduce_scatter(in.data(), chunk.data(), n, DType::kBF16, ReduceOp::kSum);
      const std::vector<std::byte> want = expected_result(DType::kBF16, ReduceOp::kSum, 3, 3 * n);
      if (std::memcmp(chunk.data(), want.data() + child.ordinal * n * 2, n * 2) != 0)
        return fmt::format("reduce_scatter n={}: chunk wrong", n);
    }
    comm.barrier();
    const std::string mine = payload_of(child.ordinal, 0);
    if (comm.rendezvous("one", std::as_bytes(std::span(mine))).size() != 3)
      return std::string("rendezvous: wrong payload count");
    if (comm.group_contexts() != 0) return fmt::format("{} group contexts", comm.group_contexts());
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// Roots: the first and last ordinals, and a leader and a non-leader of a node other than 0.
TEST_P(MultiHostTest, BroadcastCopiesTheRootsBufferFromAnyRoot) {
  run([](Child& child, MultiHostCommunicator& comm) {
    const NodeTopology& t = comm.topology();
    std::vector<int> roots = {0, t.world_size() - 1, t.first_ordinal(t.nnodes() - 1)};
    for (int node = 1; node < t.nnodes(); ++node) {
      if (t.node_size(node) > 1) roots.push_back(t.first_ordinal(node) + 1);
    }
    for (int root : roots) {
      for (size_t n : kCounts) {
        std::vector<std::byte> data = make_input(DType::kI32, child.ordinal, n);
        comm.broadcast(data.data(), n, DType::kI32, root);
        if (data != make_input(DType::kI32, root, n)) return fmt::format("n={} root={}", n, root);
      }
    }
    return std::string();
  });
}

TEST_P(MultiHostTest, AllGatherPlacesOrdinalKAtOffsetK) {
  run([](Child& child, MultiHostCommunicator& comm) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      std::vector<size_t> counts = kCounts;
      counts.push_back(300'007);  // megabytes per block, every block in flight at once
      for (size_t n : counts) {
        const std::vector<std::byte> in = make_input(dtype, child.ordinal, n);
        std::vector<std::byte> out(in.size() * child.world_size);
        comm.all_gather(in.data(), out.data(), n, dtype);
        for (int k = 0; k < child.world_size; ++k) {
          const std::vector<std::byte> want = make_input(dtype, k, n);
          if (!want.empty() &&
              std::memcmp(out.data() + k * want.size(), want.data(), want.size()) != 0) {
            return fmt::format("{} n={}: block of ordinal {} wrong", dtype_name(dtype), n, k);
          }
        }
      }
    }
    return std::string();
  });
}

TEST_P(MultiHostTest, AllGatherPiecesFillsEveryPiece) {
  run([](Child& child, MultiHostCommunicator& comm) {
    const size_t n = 1023;
    const std::vector<std::byte> in = make_input(DType::kF32, child.ordinal, n);
    std::vector<std::byte> whole;
    for (int k = 0; k < child.world_size; ++k) {
      const std::vector<std::byte> part = make_input(DType::kF32, k, n);
      whole.insert(whole.end(), part.begin(), part.end());
    }
    const size_t third = whole.size() / 3;  // pieces straddle chunks and leave a gap
    std::vector<std::byte> a(third), b(whole.size() - 2 * third);
    const GatherPiece pieces[] = {{0, a.size(), a.data()}, {2 * third, b.size(), b.data()}};
    comm.all_gather_pieces(in.data(), pieces, n, DType::kF32);
    if (std::memcmp(a.data(), whole.data(), a.size()) != 0 ||
        std::memcmp(b.data(), whole.data() + 2 * third, b.size()) != 0) {
      return std::string("a piece differs from the gathered bytes");
    }
    return std::string();
  });
}

// The input of ordinal o is make_input(o) of world_size * n elements, so chunk k of the
// reduction is the closed form's elements k * n .. (k + 1) * n - 1.
TEST_P(MultiHostTest, ReduceScatterGivesEachOrdinalItsReducedChunk) {
  run([](Child& child, MultiHostCommunicator& comm) {
    constexpr std::pair<DType, ReduceOp> kCases[] = {{DType::kF64, ReduceOp::kSum},
                                                     {DType::kF32, ReduceOp::kMean},
                                                     {DType::kI32, ReduceOp::kMax},
                                                     {DType::kBF16, ReduceOp::kMean}};
    const auto w = static_cast<size_t>(child.world_size);
    for (const auto& [dtype, op] : kCases) {
      const size_t elem_bytes = dtype_size(dtype);
      // 300'007: each group's batch of pieces runs to megabytes, in flight both ways at once.
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, size_t{5003},
                       size_t{300'007}}) {
        const std::vector<std::byte> in = make_input(dtype, child.ordinal, w * n);
        std::vector<std::byte> out(n * elem_bytes);
        comm.reduce_scatter(in.data(), out.data(), n, dtype, op);
        const std::vector<std::byte> want = expected_result(dtype, op, child.world_size, w * n);
        if (n != 0 && std::memcmp(out.data(), want.data() + child.ordinal * n * elem_bytes,
                                  out.size()) != 0) {
          return fmt::format("{} {} n={}: chunk wrong", dtype_name(dtype), reduce_op_name(op), n);
        }
      }
    }
    return std::string();
  });
}

// Every replica counts itself in before barrier k; after it, all W must have.
TEST_P(MultiHostTest, BarrierReleasesNoOneBeforeEveryoneArrived) {
  run([](Child& child, MultiHostCommunicator& comm) {
    auto* arrived = reinterpret_cast<std::atomic<int64_t>*>(child.scratch);
    for (int k = 0; k < 5; ++k) {
      arrived->fetch_add(1);
      comm.barrier();
      const int64_t seen = arrived->load();
      if (seen < (k + 1) * child.world_size) {
        return fmt::format("barrier {}: left after {} arrivals of {}", k, seen,
                           (k + 1) * child.world_size);
      }
      comm.barrier();  // nobody counts barrier k + 1 in before everyone checked barrier k
    }
    return std::string();
  });
}

TEST_P(MultiHostTest, RendezvousExchangesPayloadsOfAnySize) {
  run([](Child& child, MultiHostCommunicator& comm) {
    for (int round = 0; round < 3; ++round) {
      const std::string mine = payload_of(child.ordinal, round);
      const auto all =
          comm.rendezvous(fmt::format("step-{}", round), std::as_bytes(std::span(mine)));
      if (all.size() != static_cast<size_t>(child.world_size))
        return fmt::format("{} payloads", all.size());
      for (int k = 0; k < child.world_size; ++k) {
        const std::string got(reinterpret_cast<const char*>(all[k].data()), all[k].size());
        if (got != payload_of(k, round)) return fmt::format("round {}: payload {} wrong", round, k);
      }
    }
    return std::string();
  });
}

// Every replica hears of the mismatch, and the communicator stays usable.
TEST_P(MultiHostTest, RendezvousTagsThatDifferBetweenNodesAreReportedEverywhere) {
  run([](Child&, MultiHostCommunicator& comm) -> std::string {
    const std::string tag =
        comm.topology().node() == comm.topology().nnodes() - 1 ? "tag-b" : "tag-a";
    try {
      comm.rendezvous(tag, {});
      return "no error for different tags";
    } catch (const PeerFailure& e) {
      const std::string what = e.what();
      if (what.find("'tag-a'") == std::string::npos || what.find("'tag-b'") == std::string::npos)
        return "message lacks both tags: " + what;
    }
    comm.rendezvous("same", {});
    return std::string();
  });
}

INSTANTIATE_TEST_SUITE_P(Topologies, MultiHostTest,
                         ::testing::Values(std::vector<int>{1, 1}, std::vector<int>{2, 2},
                                           std::vector<int>{1, 2, 1}, std::vector<int>{2, 1},
                                           std::vector<int>{3, 1, 2}),
                         topology_name);

}  // namespace
}  // namespace xs::testing
