// all_gather_pieces across forked replicas: the gathered bytes land in the pieces (which cut
// across ordinals' chunks and leave gaps) and nowhere else, for operands in every arena (the
// direct form), on the heap (staging), mixed, and through Communicator's default.
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include <fmt/format.h>

#include "xla_spawn/collectives/local_communicator.h"
#include "tests/collectives/fork_harness.h"
#include "tests/collectives/test_data.h"

namespace xs::testing {
namespace {

constexpr size_t kStagingBytes = 64 << 10;
// 0, one element, odd, and more than one staging half (the staging schedule takes slabs).
const std::vector<size_t> kCounts = {0, 1, 1023, 3 * kStagingBytes / 4 + 5};
constexpr std::byte kGuard{0xA5};
constexpr size_t kGuardBytes = 64;

// Where each ordinal's operand lives.
enum class Operands { kArena, kHeap, kMixed, kDefault };

// Forwards everything but all_gather_pieces, so Communicator's default implementation runs.
class Forwarding final : public Communicator {
 public:
  explicit Forwarding(Communicator& inner) : inner_(inner) {}
  int ordinal() const override { return inner_.ordinal(); }
  int world_size() const override { return inner_.world_size(); }
  void all_reduce(void* d, size_t n, DType t, ReduceOp op) override { inner_.all_reduce(d, n, t, op); }
  void broadcast(void* d, size_t n, DType t, int root) override { inner_.broadcast(d, n, t, root); }
  void all_gather(const void* in, void* out, size_t n, DType t) override {
    inner_.all_gather(in, out, n, t);
  }
  void reduce_scatter(const void* in, void* out, size_t n, DType t, ReduceOp op) override {
    inner_.reduce_scatter(in, out, n, t, op);
  }
  void barrier() override { inner_.barrier(); }
  std::vector<std::vector<std::byte>> rendezvous(const std::string& tag,
                                                 std::span<const std::byte> p) override {
    return inner_.rendezvous(tag, p);
  }

 private:
  Communicator& inner_;
};

// Pieces of `total` gathered bytes: irregular lengths that straddle chunk boundaries, every
// third range left out (a gap no piece covers), each piece in its own guarded buffer.
struct Pieces {
  std::vector<GatherPiece> pieces;
  std::vector<std::vector<std::byte>> buffers;  // kGuardBytes, the piece, kGuardBytes

  explicit Pieces(size_t total) {
    size_t at = 0;
    for (size_t k = 0; at < total; ++k) {
      const size_t len = std::min(total - at, 4 * (37 + 1009 * k));
      if (k % 3 != 2) {
        buffers.emplace_back(len + 2 * kGuardBytes, kGuard);
        pieces.push_back({at, len, buffers.back().data() + kGuardBytes});
      }
      at += len;
    }
  }

  // "" when every piece holds the gathered bytes and every guard is intact.
  std::string check(const std::vector<std::byte>& gathered) const {
    for (size_t k = 0; k < pieces.size(); ++k) {
      const GatherPiece& p = pieces[k];
      const std::vector<std::byte>& b = buffers[k];
      if (p.size_bytes != 0 &&
          std::memcmp(p.data, gathered.data() + p.offset_bytes, p.size_bytes) != 0) {
        return fmt::format("piece {} ([{}, {})) differs from the gathered bytes", k,
                           p.offset_bytes, p.offset_bytes + p.size_bytes);
      }
      for (size_t i = 0; i < kGuardBytes; ++i) {
        if (b[i] != kGuard || b[b.size() - 1 - i] != kGuard)
          return fmt::format("piece {}: a byte outside it was written", k);
      }
    }
    return "";
  }
};

std::vector<std::byte> gathered(int world_size, size_t n) {
  std::vector<std::byte> all;
  for (int k = 0; k < world_size; ++k) {
    const std::vector<std::byte> part = make_input(DType::kF32, k, n);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

class GatherPiecesTest : public ::testing::TestWithParam<std::tuple<int, Operands>> {};

TEST_P(GatherPiecesTest, WritesExactlyTheGatheredBytesEachPieceCovers) {
  const auto [world_size, operands] = GetParam();
  ForkJob job(world_size, kStagingBytes);
  job.start([operands](Child& child) {
    ShmCommunicator shm = child.communicator();
    Forwarding forwarding(shm);
    Communicator& comm =
        operands == Operands::kDefault ? static_cast<Communicator&>(forwarding) : shm;
    const bool arena = operands == Operands::kArena ||
                       (operands == Operands::kMixed && child.ordinal % 2 == 0);
    const size_t largest = kCounts.back() * sizeof(float);
    auto* operand = static_cast<std::byte*>(arena ? shm.alloc_buffer(largest) : nullptr);
    std::vector<std::byte> heap(arena ? 0 : largest);
    if (!arena) operand = heap.data();
    if (arena && !shm.in_arena(operand, largest)) return std::string("operand not in the arena");
    for (size_t n : kCounts) {
      const std::vector<std::byte> in = make_input(DType::kF32, child.ordinal, n);
      if (n != 0) std::memcpy(operand, in.data(), in.size());
      const Pieces pieces(in.size() * static_cast<size_t>(child.world_size));
      comm.all_gather_pieces(operand, pieces.pieces, n, DType::kF32);
      const std::string why = pieces.check(gathered(child.world_size, n));
      if (!why.empty()) return fmt::format("n={}: {}", n, why);
    }
    if (arena) shm.free_buffer(operand);
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

std::string test_name(const ::testing::TestParamInfo<std::tuple<int, Operands>>& info) {
  static const char* const kNames[] = {"Arena", "Heap", "Mixed", "Default"};
  return fmt::format("N{}{}", std::get<0>(info.param),
                     kNames[static_cast<int>(std::get<1>(info.param))]);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GatherPiecesTest,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(Operands::kArena, Operands::kHeap,
                                                              Operands::kMixed,
                                                              Operands::kDefault)),
                         test_name);

TEST(GatherPiecesLocal, WorldSizeOneCopiesTheInputIntoThePieces) {
  LocalCommunicator comm;
  const size_t n = 1023;
  const std::vector<std::byte> in = make_input(DType::kF32, 0, n);
  const Pieces pieces(in.size());
  comm.all_gather_pieces(in.data(), pieces.pieces, n, DType::kF32);
  EXPECT_EQ(pieces.check(in), "");
}

TEST(GatherPiecesLocal, RejectsAPieceOutsideTheGatheredBytes) {
  LocalCommunicator comm;
  std::vector<float> in(8), out(8);
  const GatherPiece past{4, 32, out.data()};  // 4 + 32 > 8 floats = 32 bytes
  EXPECT_THROW(comm.all_gather_pieces(in.data(), {&past, 1}, in.size(), DType::kF32),
               InvalidArgument);
}

}  // namespace
}  // namespace xs::testing
