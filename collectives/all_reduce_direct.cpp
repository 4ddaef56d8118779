// Direct (zero-copy) all-reduce: a two-shot over operands in the replicas' buffer arenas,
// which every process maps, so peers read and write each other's operands in place.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/detail/schedules.h"
#include "xla_spawn/collectives/reduce.h"

namespace xs::detail {
namespace {

// Where the operand descriptor sits in a mailbox's inline payload.
constexpr size_t kAddressAt = 0;
constexpr size_t kArenaOffsetAt = 8;
static_assert(kArenaOffsetAt + sizeof(uint64_t) <= shm::kInlineBytes);

// Bytes per source per block: the N source blocks (about 256 KiB in all) stay in L2 while
// they are reduced, so the copies of the result into peers' operands hit lines just read.
size_t direct_block_bytes(int world_size) {
  const size_t bytes = (size_t{256} << 10) / static_cast<size_t>(world_size);
  return std::max(shm::kCacheLineBytes, bytes / shm::kCacheLineBytes * shm::kCacheLineBytes);
}

}  // namespace

int publish_operand(Rounds& rounds, std::byte* data, uint64_t arena_offset) {
  const int parity = rounds.next_parity();
  std::byte* mine = rounds.inline_data(rounds.ordinal(), parity);
  std::memcpy(mine + kAddressAt, &data, sizeof data);
  std::memcpy(mine + kArenaOffsetAt, &arena_offset, sizeof arena_offset);
  rounds.sync();
  return parity;
}

std::vector<std::byte*> published_arena_operands(Rounds& rounds, int parity, std::byte* mine,
                                                 size_t operand_bytes) {
  const int n = rounds.world_size();
  const size_t arena_bytes = rounds.segment().arena_bytes();
  std::vector<std::byte*> operands(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    if (j == rounds.ordinal()) {
      operands[j] = mine;
      continue;
    }
    uint64_t offset;
    std::memcpy(&offset, rounds.inline_data(j, parity) + kArenaOffsetAt, sizeof offset);
    // The offset comes from shared memory: whatever scribbled there must not become a pointer
    // outside ordinal j's arena.
    if (offset > arena_bytes || operand_bytes > arena_bytes - offset) {
      throw PeerFailure(fmt::format(
          "segment {}: ordinal {}'s mailbox is corrupted: its operand of {} bytes at arena offset "
          "{} lies outside its arena of {} bytes",
          rounds.segment().name(), j, operand_bytes, offset, arena_bytes));
    }
    operands[j] = rounds.segment().arena(j) + offset;
  }
  return operands;
}

size_t direct_block_elems(int world_size, size_t elem_bytes) {
  return std::max<size_t>(1, direct_block_bytes(world_size) / elem_bytes);
}

void* published_address(Rounds& rounds, int ordinal, int parity) {
  void* address;
  std::memcpy(&address, rounds.inline_data(ordinal, parity) + kAddressAt, sizeof address);
  return address;
}

// Direct schedule, after publish_operand() showed every operand in its owner's arena.
// Ordinal j owns chunk j (cache-line aligned, disjoint): block by block it reduces chunk j
// of all N operands, in ordinal order 0..N-1, straight out of the peers' arenas into its
// own operand and the next ordinal's (one pass), copies the block to the other N - 2, and
// a final sync tells everyone that every chunk has landed. Only chunk j's owner touches
// chunk j of any operand between the two syncs, and it reads each element from every
// operand before writing it, so no data race; every ordinal gets the bits its owner
// computed. Per element each ordinal reads N and writes N, the minimum, with no staging.
void all_reduce_direct(Rounds& rounds, int parity, std::byte* data, size_t n_elems, DType dtype,
                       ReduceOp op) {
  const int n = rounds.world_size();
  const int me = rounds.ordinal();
  const size_t elem_bytes = dtype_size(dtype);
  const std::vector<std::byte*> operands =
      published_arena_operands(rounds, parity, data, n_elems * elem_bytes);
  const size_t chunk = chunk_elems(n_elems, n, elem_bytes);
  const size_t begin = std::min(n_elems, chunk * static_cast<size_t>(me));
  const size_t end = std::min(n_elems, begin + chunk);
  const size_t block_elems = direct_block_elems(n, elem_bytes);
  std::vector<const void*>& sources = rounds.sources();
  const int next = (me + 1) % n;
  for (size_t offset = begin; offset < end; offset += block_elems) {
    const size_t count = std::min(block_elems, end - offset);
    const size_t at = offset * elem_bytes;
    for (int j = 0; j < n; ++j) sources[j] = operands[j] + at;
    reduce_sources(data + at, operands[next] + at, sources.data(), n, count, dtype, op, n);
    for (int j = 0; j < n; ++j) {
      if (j != me && j != next) std::memcpy(operands[j] + at, data + at, count * elem_bytes);
    }
  }
  rounds.sync();
}

}  // namespace xs::detail
