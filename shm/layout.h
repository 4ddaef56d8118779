#pragma once
// The byte layout of a job's shared-memory segment: a control block, one slot per ordinal,
// one staging area per ordinal, then one buffer arena per ordinal (collective operands that
// peers read and write in place; see collectives/buffer_arena.h). Only shm/ and collectives/ look inside; everyone else
// holds a segment by name.
//
//   shm::OrdinalSlot& slot = segment.slot(ordinal);
//   slot.mailbox[round % 2].round.load(std::memory_order_acquire);
//
// Every field written by one process and read by another is either a lock-free std::atomic
// (address-free, so valid across processes) or plain data published by a release store of
// such an atomic. Each per-ordinal word sits on its own 64-byte cache line so that replicas
// spinning on different words never share a line.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace xs::shm {

inline constexpr uint64_t kSegmentMagic = 0x31306d68732d7378;  // "xs-shm01" little endian
// 2: buffer arenas; 3: launcher_start; 4: poisoner_pid; 5: call records; 6: arrival counts;
// 7: arenas at arena_stride()
inline constexpr uint32_t kSegmentVersion = 7;
inline constexpr size_t kCacheLineBytes = 64;
inline constexpr size_t kPageBytes = 4096;
inline constexpr size_t kMaxJobIdBytes = 96;  // including the terminating NUL
inline constexpr size_t kPoisonReasonBytes = 448;
inline constexpr size_t kInlineBytes = 32;  // payload carried in a mailbox's own cache line
// Replicas one segment holds: replica/context.h's kMaxLocalWorldSize; catches typos, not limits.
inline constexpr int kMaxWorldSize = 1024;

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

enum class SlotState : uint32_t { kEmpty = 0, kCheckedIn = 1, kLeft = 2 };

// What an ordinal publishes for one synchronisation round: the round number (the futex
// word, stored last with release), the header of the collective call it is in (so peers can
// detect mismatched calls), and up to kInlineBytes of payload on the same cache line, so a
// tiny all-reduce moves one cache line per ordinal. Two mailboxes per ordinal alternate by
// round parity: round r's content stays intact until the owner starts round r + 2.
struct alignas(kCacheLineBytes) Mailbox {
  std::atomic<uint32_t> round{0};
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t in_arena = 0;  // all_reduce: the operand is in the ordinal's buffer arena
  uint64_t n_elems = 0;
  uint64_t call_seq = 0;
  int32_t aux = 0;  // per-kind extra: broadcast root, rendezvous tag length
  // When the ordinal began the call: CLOCK_MONOTONIC in microseconds, modulo 2^32 (peers
  // compare arrivals by the wrapped difference, good for calls within 35 minutes).
  uint32_t arrived_us = 0;
  std::byte inline_data[kInlineBytes];
};
static_assert(sizeof(Mailbox) == kCacheLineBytes);

struct alignas(kCacheLineBytes) FutexLine {
  std::atomic<uint32_t> value{0};
};

// What the ordinal is doing, for the launcher's hang report (shm/call_report.h): written by
// the ordinal alone (Rounds::begin_call, end_call and the network phase marks,
// Waiter::wait_slow), read racily by the launcher.
struct alignas(kCacheLineBytes) CallRecord {
  std::atomic<uint64_t> seq{0};  // collective calls begun (the latest one's number); 0: none
  std::atomic<uint64_t> n_elems{0};
  std::atomic<uint64_t> graph_hash{0};        // the runtime program making the call; 0: none
  std::atomic<int64_t> started_ns{0};         // CLOCK_MONOTONIC when the call began
  std::atomic<int64_t> waiting_since_ns{0};   // asleep in a wait since; 0: not
  std::atomic<int32_t> awaited{-1};           // the ordinal that wait is for; -1: unknown
  std::atomic<uint8_t> dtype{0};
  // 1: the checked-in process handles stack_dump_signal() (shm/stack_dump.h); set at attach.
  std::atomic<uint8_t> dumps_stack{0};
  std::atomic<uint8_t> returned{0};  // 1: call `seq` has returned (between calls)
  // 1: in a multi-node call's network phase (name, dtype, n_elems, started_ns and
  // waiting_since_ns are that call's), outside the shared-memory calls `seq` counts.
  std::atomic<uint8_t> between_nodes{0};
  char name[16] = {};  // the call's operation ("reduce_scatter"), NUL-padded
};
static_assert(sizeof(CallRecord) == kCacheLineBytes);

// Who arrives last at collectives, for the launcher's straggler report (shm/call_report.h):
// written by the ordinal alone, at the first round of each call, read racily by the launcher.
// A call "waited" when its last arrival came kLateArrivalUs or more after its first: calls
// whose replicas arrive together have no straggler, only a random last. The first call of
// each runtime step (mark_step's program: where a slow replica's step shows) is counted apart
// from the others (the step's later calls, checkpoints, evaluation, host reads, eager calls),
// whose lateness says less about a replica.
inline constexpr uint32_t kLateArrivalUs = 50;
struct ArrivalGroup {
  std::atomic<uint64_t> calls{0};    // calls this ordinal completed a first round of
  std::atomic<uint64_t> waited{0};   // of which waited for their last arrival
  std::atomic<uint64_t> last{0};     // of those, the ones it arrived last at (ties: higher ordinal)
  std::atomic<uint64_t> late_us{0};  // summed over those: its arrival minus the first one's
};
struct alignas(kCacheLineBytes) ArrivalCounts {
  ArrivalGroup steps;  // a step's first call (base/running_graph.h)
  ArrivalGroup other;
  // When this ordinal arrived at its first and latest counted step (CLOCK_MONOTONIC, us): the
  // launcher divides by the steps to know how long a step takes.
  alignas(kCacheLineBytes) std::atomic<uint64_t> first_step_us{0};
  std::atomic<uint64_t> last_step_us{0};
};

struct alignas(kCacheLineBytes) OrdinalSlot {
  std::atomic<int32_t> pid{0};  // 0 until the ordinal checks in
  std::atomic<uint32_t> state{0};
  Mailbox mailbox[2];
  FutexLine ring_sent;   // ring steps whose send this ordinal has published
  FutexLine ring_acked;  // ring steps whose receive this ordinal has consumed
  CallRecord call;
  ArrivalCounts arrivals;
};

struct alignas(kCacheLineBytes) ControlBlock {
  // Written once by the creator before `magic`; read-only afterwards.
  std::atomic<uint64_t> magic{0};
  uint32_t version = 0;
  uint32_t world_size = 0;
  uint64_t staging_bytes = 0;  // per ordinal; a multiple of kPageBytes
  uint64_t total_bytes = 0;
  uint64_t arena_bytes = 0;  // per ordinal; a multiple of kPageBytes, may be 0
  int32_t launcher_pid = 0;
  uint32_t spin_allowed = 0;  // 0 when replicas outnumber cores: waits never spin
  // The launcher's start time (process_start_ticks): the stale sweep takes a live process
  // under launcher_pid for the launcher only when its start time is this one.
  uint64_t launcher_start = 0;
  char job_id[kMaxJobIdBytes] = {};

  // 0 while healthy; 1 + the ordinal that poisoned it. `poison_claim` picks the one
  // writer of `poisoner_pid` (its process, as checked in to that ordinal's slot) and
  // `poison_reason`, which are complete before `poisoned` is stored. A record whose pid is
  // not the slot's was not written by the ordinal it names and is not believed.
  alignas(kCacheLineBytes) std::atomic<uint32_t> poisoned{0};
  std::atomic<uint32_t> poison_claim{0};
  std::atomic<int32_t> poisoner_pid{0};
  char poison_reason[kPoisonReasonBytes] = {};

  // Central barrier for oversubscribed jobs: total arrivals and the last completed round.
  alignas(kCacheLineBytes) std::atomic<uint64_t> barrier_count{0};
  std::atomic<uint32_t> barrier_round{0};

  // Processes currently inside futex_wait on any word of this segment; publishers skip the
  // FUTEX_WAKE system call while it is 0.
  alignas(kCacheLineBytes) std::atomic<uint32_t> sleepers{0};
};

inline constexpr size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
inline constexpr size_t slots_offset() {
  return round_up(sizeof(ControlBlock), kCacheLineBytes);
}
inline constexpr size_t staging_offset(int world_size) {
  return round_up(slots_offset() + sizeof(OrdinalSlot) * static_cast<size_t>(world_size),
                  kPageBytes);
}
// The arenas lie one after the other, so operands at the same offset in two ordinals' arenas
// are a whole number of arena strides apart, and the direct schedules run one pass over such
// lines of several operands at once. At a large power of two apart they collide in the CPU's
// first-level cache: with 256 MiB arenas back to back, a 16 MiB all-reduce at N = 2 took
// 3.3-3.7 ms on an AMD Zen 3 against 1.1-1.5 ms with the stride (4 MiB: 6x; arenas 128 MiB
// apart were half as bad, 129 MiB fine: consistent with the L1 way predictor's tags, a hash
// of address bits 12-27). So an
// arena of arena_bytes (a page multiple) starts arena_stride() after the previous one: its size
// rounded up to whole MiB plus 17 pages, whence any two ordinals less than 256 apart lie a
// distance apart whose bits 12-19 are not all zero. The gap is never touched (sparse tmpfs).
inline constexpr size_t kArenaStaggerBytes = 17 * kPageBytes;
inline constexpr size_t arena_stride(size_t arena_bytes) {
  return arena_bytes == 0 ? 0 : round_up(arena_bytes, size_t{1} << 20) + kArenaStaggerBytes;
}
inline constexpr size_t arena_offset(int world_size, size_t staging_bytes) {
  return staging_offset(world_size) + staging_bytes * static_cast<size_t>(world_size);
}
inline constexpr size_t segment_bytes(int world_size, size_t staging_bytes, size_t arena_bytes) {
  return arena_offset(world_size, staging_bytes) +
         arena_stride(arena_bytes) * static_cast<size_t>(world_size);
}

}  // namespace xs::shm
