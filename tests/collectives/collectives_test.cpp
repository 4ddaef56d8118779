// broadcast, all_gather, reduce_scatter, barrier and rendezvous across forked replicas,
// world sizes 2..8, sizes from 0 to more than the staging area.
#include <gtest/gtest.h>

#include <cstring>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/detail/rounds.h"
#include "tests/collectives/fork_harness.h"
#include "tests/collectives/test_data.h"

namespace xs::testing {
namespace {

constexpr size_t kStagingBytes = 64 << 10;
const std::vector<size_t> kCounts = {0, 1, 1023, 3 * kStagingBytes / 4 + 5};

class CollectivesTest : public ::testing::TestWithParam<int> {
 protected:
  void run(const std::function<std::string(Child&, ShmCommunicator&)>& body) {
    ForkJob job(GetParam(), kStagingBytes);
    job.start([&body](Child& child) {
      ShmCommunicator comm = child.communicator();
      return body(child, comm);
    });
    const JobResult result = job.wait(std::chrono::seconds(60));
    EXPECT_TRUE(result.all_ok()) << result.describe();
  }
};

TEST_P(CollectivesTest, BroadcastCopiesTheRootsBufferEverywhere) {
  run([](Child& child, ShmCommunicator& comm) {
    for (size_t n : kCounts) {
      const int root = static_cast<int>(n % child.world_size);
      std::vector<std::byte> data = make_input(DType::kI32, child.ordinal, n);
      comm.broadcast(data.data(), n, DType::kI32, root);
      if (data != make_input(DType::kI32, root, n)) return fmt::format("n={} root={}", n, root);
    }
    return std::string();
  });
}

TEST_P(CollectivesTest, AllGatherPlacesOrdinalKAtOffsetK) {
  run([](Child& child, ShmCommunicator& comm) {
    for (size_t n : kCounts) {
      const std::vector<std::byte> in = make_input(DType::kF32, child.ordinal, n);
      std::vector<std::byte> out(in.size() * child.world_size);
      comm.all_gather(in.data(), out.data(), n, DType::kF32);
      for (int k = 0; k < child.world_size; ++k) {
        const std::vector<std::byte> want = make_input(DType::kF32, k, n);
        if (!want.empty() &&
            std::memcmp(out.data() + k * want.size(), want.data(), want.size()) != 0) {
          return fmt::format("n={}: block of ordinal {} wrong", n, k);
        }
      }
    }
    return std::string();
  });
}

TEST_P(CollectivesTest, ReduceScatterGivesEachOrdinalItsReducedChunk) {
  run([](Child& child, ShmCommunicator& comm) {
    const int n_ord = child.world_size;
    for (size_t n : kCounts) {
      // Input chunk k of ordinal o is the first n elements of make_input(o * n_ord + k).
      std::vector<std::byte> in;
      for (int k = 0; k < n_ord; ++k) {
        const auto part = make_input(DType::kF64, child.ordinal * n_ord + k, n);
        in.insert(in.end(), part.begin(), part.end());
      }
      std::vector<std::byte> out(n * 8);
      comm.reduce_scatter(in.data(), out.data(), n, DType::kF64, ReduceOp::kSum);
      for (size_t i = 0; i < n; ++i) {
        double want = 0, got;
        for (int o = 0; o < n_ord; ++o)
          want += static_cast<double>(input_value(o * n_ord + child.ordinal, i));
        std::memcpy(&got, out.data() + i * 8, 8);
        if (got != want) return fmt::format("n={} element {}: {} != {}", n, i, got, want);
      }
    }
    return std::string();
  });
}

// The in-place forms (the smaller operand exactly this ordinal's chunk of the larger) work;
// any other overlap, which had the call overwrite what it still had to read, is refused on
// every ordinal before the call starts, and the communicator goes on working.
TEST_P(CollectivesTest, OverlappingOperandsWorkInPlaceAndAreRefusedOtherwise) {
  run([](Child& child, ShmCommunicator& comm) {
    constexpr size_t n = 1000;
    const auto world = static_cast<size_t>(child.world_size);
    const auto me = static_cast<size_t>(child.ordinal);
    const size_t other = (me + 1) % world;
    std::vector<float> whole(n * world, 0.0f);
    std::fill(whole.begin() + me * n, whole.begin() + (me + 1) * n, static_cast<float>(me + 1));
    comm.all_gather(whole.data() + me * n, whole.data(), n, DType::kF32);
    for (size_t k = 0; k < world; ++k) {
      if (whole[k * n] != static_cast<float>(k + 1) || whole[k * n + n - 1] != static_cast<float>(k + 1))
        return fmt::format("in-place all_gather: chunk {} holds {}", k, whole[k * n]);
    }
    std::fill(whole.begin(), whole.end(), 1.0f);
    comm.reduce_scatter(whole.data(), whole.data() + me * n, n, DType::kF32, ReduceOp::kSum);
    if (whole[me * n] != static_cast<float>(world)) return fmt::format("in-place reduce_scatter: {}", whole[me * n]);
    std::string refused;
    try {
      comm.all_gather(whole.data() + other * n, whole.data(), n, DType::kF32);
    } catch (const InvalidArgument& e) {
      refused += e.what();
    }
    try {
      comm.reduce_scatter(whole.data(), whole.data() + other * n + 1, n, DType::kF32, ReduceOp::kSum);
    } catch (const InvalidArgument& e) {
      refused += e.what();
    }
    if (refused.find("all_gather: input and output overlap") == std::string::npos ||
        refused.find("reduce_scatter: input and output overlap") == std::string::npos) {
      return "not both refused: " + refused;
    }
    std::vector<float> ones(8, 1.0f);
    comm.all_reduce(ones.data(), ones.size(), DType::kF32, ReduceOp::kSum);
    return ones[0] == static_cast<float>(world) ? std::string() : fmt::format("after: {}", ones[0]);
  });
}

TEST_P(CollectivesTest, BarrierAndRendezvousExchangePayloads) {
  run([](Child& child, ShmCommunicator& comm) {
    comm.barrier();
    const std::string mine = fmt::format("payload of {}", child.ordinal);
    const auto all = comm.rendezvous("step-1", std::as_bytes(std::span(mine)));
    for (int k = 0; k < child.world_size; ++k) {
      const std::string want = fmt::format("payload of {}", k);
      if (std::string(reinterpret_cast<const char*>(all[k].data()), all[k].size()) != want) {
        return fmt::format("payload {} wrong", k);
      }
    }
    try {
      comm.rendezvous(child.ordinal == 0 ? "tag-a" : "tag-b", {});
    } catch (const PeerFailure& e) {
      const std::string what = e.what();
      if (what.find("tag-a") != std::string::npos && what.find("tag-b") != std::string::npos) {
        return std::string();
      }
      return "tag mismatch message lacks both tags: " + what;
    }
    return std::string("no error for different tags");
  });
}

// A peer that publishes impossible lengths (a scribbled or hostile segment) is an error naming
// it, never a read past its staging half.
TEST(RendezvousTest, ImpossibleLengthsFromAPeerAreAnError) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) -> std::string {
    const uint64_t bogus[2][2] = {{uint64_t{1} << 40, 0}, {1, uint64_t{1} << 40}};
    if (child.ordinal == 1) {  // hand-written rounds with bogus tag, then payload, lengths
      detail::Rounds rounds(child.attach(), 30'000);
      for (const auto& lengths : bogus) {
        rounds.begin_call("rendezvous", detail::CallHeader{detail::CallKind::kRendezvous,
                                                           DType::kBool, ReduceOp::kSum, 0, 0});
        const detail::CallEnd end(rounds);  // one call at a time
        std::byte* mine = rounds.staging(1, rounds.next_parity());
        std::memcpy(mine, lengths, sizeof lengths);
        std::memcpy(mine + sizeof lengths, "t", 1);
        rounds.sync();
      }
      return std::string();
    }
    ShmCommunicator comm = child.communicator();
    for (const char* what : {"tag", "payload"}) {
      try {
        comm.rendezvous("t", {});
        return fmt::format("no error for a bogus {} length", what);
      } catch (const PeerFailure& e) {
        const std::string message = e.what();
        if (message.find("ordinal 1") == std::string::npos ||
            message.find(what) == std::string::npos) {
          return "message lacks the ordinal or the field: " + message;
        }
      }
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesTest, ::testing::Values(2, 3, 8));

}  // namespace
}  // namespace xs::testing
