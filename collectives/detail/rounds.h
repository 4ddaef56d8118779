#pragma once
// Synchronisation rounds over a segment, the building block of every shared-memory
// collective: an ordinal fills its staging half (or mailbox) for round r, then sync() posts r
// and waits until every ordinal has posted r; afterwards it may read every peer's round-r data.
//
//   rounds.begin_call("all_reduce", header);        // the first sync() checks headers
//   std::memcpy(rounds.staging(me, rounds.next_parity()), data, bytes);
//   rounds.sync();
//   read(rounds.staging(peer, rounds.last_parity()));
//
// Invariant that makes two staging halves enough: round r's data lives in half r % 2; the
// owner writes it after waiting for round r - 1 and before posting r; peers read it after
// waiting for r and before posting r + 1. The owner rewrites half r % 2 only after waiting
// for r + 1, i.e. after every peer has stopped reading round r.
//
// Posting and waiting: with spinning allowed (world size <= cores), an ordinal spins on each
// peer's mailbox word. Oversubscribed, every ordinal also counts itself in a central arrival
// counter; the last arrival stores the round into `barrier_round` and wakes everyone, so each
// replica sleeps at most once per round. Memory ordering: data then mailbox round (release);
// the counter's fetch_add chain is acq_rel, `barrier_round` is released by the last arrival
// and acquired by the waiters, so all peers' data is visible after sync().

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <vector>

#include "xla_spawn/base/dtype.h"
#include "xla_spawn/shm/segment.h"
#include "xla_spawn/shm/wait.h"

namespace xs::detail {

// Whether a round counter has reached target; wraps correctly past 2^32 rounds.
inline bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

enum class CallKind : uint8_t {
  kAllReduce = 1,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kBarrier,
  kRendezvous,
  kReduceRanges,
  kGatherRanges,
};
const char* call_kind_name(CallKind kind);

// What every ordinal must agree on for one collective call.
struct CallHeader {
  CallKind kind = CallKind::kBarrier;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t n_elems = 0;
  // broadcast: root; reduce_ranges, gather_ranges: digest of the bounds; all_reduce: 1 + the
  // forced AllReduceAlgorithm, 0 when chosen
  int32_t aux = 0;
  // all_reduce: this ordinal's operand is in its buffer arena. Published with every round
  // but not part of the mismatch check: replicas that differ fall back to a staging schedule.
  bool in_arena = false;
};

class Rounds {
 public:
  Rounds(Segment segment, int64_t timeout_ms);

  int ordinal() const { return segment_.ordinal(); }
  int world_size() const { return segment_.world_size(); }
  const Segment& segment() const { return segment_; }
  Waiter& waiter() { return waiter_; }
  const char* operation() const { return operation_; }
  const CallHeader& header() const { return header_; }

  // Staging bytes per ordinal per round parity (a multiple of 64).
  size_t half_bytes() const { return half_bytes_; }
  // The whole per-ordinal staging area (for schedules that manage it themselves).
  std::byte* staging_area(int ordinal) const { return segment_.staging(ordinal); }
  std::byte* staging(int ordinal, int parity) const {
    return segment_.staging(ordinal) + static_cast<size_t>(parity) * half_bytes_;
  }
  std::byte* inline_data(int ordinal, int parity) const {
    return segment_.slot(ordinal).mailbox[parity].inline_data;
  }
  int next_parity() const { return static_cast<int>((round_ + 1) & 1); }
  int last_parity() const { return static_cast<int>(round_ & 1); }

  // Starts a collective call: every sync() of it publishes `header` and when the call began;
  // the first one throws xs::PeerFailure naming both sides if any ordinal's header differs,
  // and counts the last arrival in its slot (shm::ArrivalCounts). Throws xs::InvalidArgument
  // in a child forked after these rounds were made, or while another thread is inside a call
  // (until its CallEnd), before touching the segment.
  void begin_call(const char* operation, const CallHeader& header);
  // The call is over (CallEnd, however it ended): the next may begin.
  void leave_call() const;
  // Posts the next round and waits until every ordinal has posted it.
  void sync();
  // Marks the call returned in the hang report's record (CallEnd, when the call succeeds).
  void end_call() const;
  // The hang report's record between calls of these rounds: the ordinal is in the network
  // phase of a multi-node call (MultiHostCommunicator's transfers between nodes) until
  // end_network_phase(), which one that fails does not reach: its record keeps the wait.
  void begin_network_phase(const char* operation, std::optional<DType> dtype,
                           size_t n_elems) const;
  void end_network_phase() const;
  // Throws xs::PeerFailure if the segment is poisoned: called as a call returns (CallEnd).
  void check_not_poisoned() const;
  // After a sync() of this call: did every ordinal publish in_arena with round `parity`?
  bool all_in_arena(int parity) const;
  bool any_in_arena(int parity) const;

  // One pointer per ordinal, for assembling reduction sources.
  std::vector<const void*>& sources() { return sources_; }
  // Ring step counter, persistent across calls (see all_reduce_ring.cpp).
  uint32_t& ring_step() { return ring_step_; }
  // Private scratch memory of at least `bytes`, reused across calls.
  std::vector<std::byte>& scratch(size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_;
  }

 private:
  void post(shm::Mailbox& mine, uint64_t round);
  void wait_all(uint64_t round, int parity);
  void check_call(int parity);
  void check_can_begin(const char* operation) const;

  Segment segment_;
  Waiter waiter_;
  size_t half_bytes_;
  uint64_t round_ = 0;  // rounds posted so far
  uint64_t call_seq_ = 0;
  uint64_t started_us_ = 0;  // when the current call began, CLOCK_MONOTONIC us
  bool step_start_ = false;    // the current call is a step's first (shm::ArrivalCounts)
  uint64_t counted_step_ = 0;  // the last step (base/running_graph.h) counted
  CallHeader header_;
  const char* operation_ = "collective";
  bool check_pending_ = false;
  uint32_t ring_step_ = 0;
  std::vector<const void*> sources_;
  std::vector<std::byte> scratch_;
  uint64_t fork_epoch_;  // detail::fork_epoch() when made: a forked child's calls are refused
  mutable std::atomic<bool> in_call_{false};  // between begin_call and its CallEnd
};

// Declared after begin_call: when the call returns normally, it fails instead if the segment
// was poisoned meanwhile. A peer that gave its call up (a timeout; Ctrl-C in Python) left while
// this ordinal may still have been reading its operand, which it may change at once after
// leaving (it poisons first, then returns): what was read then cannot be trusted.
class CallEnd {
 public:
  explicit CallEnd(const Rounds& rounds)
      : rounds_(rounds), exceptions_(std::uncaught_exceptions()) {}
  // A call that fails keeps its record as it was: the hang report shows the wait it died in.
  ~CallEnd() noexcept(false) {
    rounds_.leave_call();
    if (std::uncaught_exceptions() != exceptions_) return;
    rounds_.check_not_poisoned();
    rounds_.end_call();
  }
  CallEnd(const CallEnd&) = delete;
  CallEnd& operator=(const CallEnd&) = delete;

 private:
  const Rounds& rounds_;
  int exceptions_;
};

}  // namespace xs::detail
