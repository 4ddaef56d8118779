// BufferArena (first-fit allocation in a replica's arena) and ShmCommunicator::alloc_buffer,
// which falls back to the heap when the arena is full.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/buffer_arena.h"
#include "tests/collectives/fork_harness.h"

namespace xs::testing {
namespace {

constexpr size_t kPage = BufferArena::kAlignBytes;

TEST(BufferArenaTest, BlocksArePageAlignedDisjointAndInside) {
  std::vector<std::byte> memory(64 * kPage + kPage);
  auto* base = reinterpret_cast<std::byte*>(
      (reinterpret_cast<uintptr_t>(memory.data()) + kPage - 1) / kPage * kPage);
  BufferArena arena(base, 64 * kPage);
  auto* a = static_cast<std::byte*>(arena.allocate(1));
  auto* b = static_cast<std::byte*>(arena.allocate(kPage + 1));
  auto* c = static_cast<std::byte*>(arena.allocate(0));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % kPage, 0u);
  EXPECT_GE(b, a + kPage);
  EXPECT_GE(c, b + 2 * kPage);
  EXPECT_TRUE(arena.contains(b, kPage + 1));
  EXPECT_FALSE(arena.contains(base + 63 * kPage, kPage + 1));
  EXPECT_FALSE(arena.contains(memory.data() + memory.size() - 1, 1));
  EXPECT_EQ(arena.offset(b), static_cast<size_t>(b - base));
  EXPECT_EQ(arena.free_bytes(), 60 * kPage);
}

TEST(BufferArenaTest, FreedBlocksCoalesceAndAreReused) {
  std::vector<std::byte> memory(16 * kPage);
  BufferArena arena(memory.data(), 16 * kPage);
  void* a = arena.allocate(4 * kPage);
  void* b = arena.allocate(4 * kPage);
  void* c = arena.allocate(8 * kPage);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(arena.allocate(1), nullptr) << "full arena must say so";
  arena.deallocate(a);
  arena.deallocate(b);  // a and b coalesce: 8 pages in one piece
  EXPECT_EQ(arena.allocate(8 * kPage), a);
  arena.deallocate(c);
  EXPECT_THROW(arena.deallocate(c), InvalidArgument) << "double free";
  EXPECT_THROW(arena.deallocate(memory.data() + 1), InvalidArgument);
}

TEST(BufferArenaTest, CommunicatorFallsBackToTheHeapWhenTheArenaIsFull) {
  ForkJob job(2, kDefaultStagingBytes, 8 * kPage);
  job.start([](Child& child) {
    ShmCommunicator comm = child.communicator();
    void* in = comm.alloc_buffer(8 * kPage);
    void* out = comm.alloc_buffer(100);
    std::string failure;
    if (!comm.in_arena(in, 8 * kPage)) failure += "first block not in the arena; ";
    if (comm.in_arena(out, 100)) failure += "overflow block in the arena; ";
    if (reinterpret_cast<uintptr_t>(out) % Communicator::kBufferAlignBytes != 0) {
      failure += "heap block not aligned; ";
    }
    // Ordinal 0's operand is in its arena, ordinal 1's is not: still correct.
    auto* data = static_cast<int32_t*>(child.ordinal == 0 ? in : out);
    for (int i = 0; i < 25; ++i) data[i] = child.ordinal + i;
    comm.all_reduce(data, 25, DType::kI32, ReduceOp::kSum);
    for (int i = 0; i < 25; ++i) {
      if (data[i] != 1 + 2 * i) failure += "wrong sum; ";
    }
    comm.free_buffer(out);
    comm.free_buffer(in);
    return failure;
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

}  // namespace
}  // namespace xs::testing
