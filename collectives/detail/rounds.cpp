#include "xla_spawn/collectives/detail/rounds.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/base/running_graph.h"
#include "xla_spawn/base/trace.h"
#include "xla_spawn/collectives/all_reduce_algorithm.h"
#include "xla_spawn/collectives/detail/fork_epoch.h"
#include "xla_spawn/shm/call_report.h"
#include "xla_spawn/shm/futex.h"

namespace xs::detail {
namespace {

std::string describe(const shm::Mailbox& m) {
  const auto kind = static_cast<CallKind>(m.kind);
  // A barrier moves nothing: no count nor dtype to name.
  if (kind == CallKind::kBarrier) return fmt::format("barrier #{}", m.call_seq);
  std::string text = fmt::format("{} #{} with {} elements of {}", call_kind_name(kind), m.call_seq,
                                 m.n_elems, dtype_name(static_cast<DType>(m.dtype)));
  if (kind == CallKind::kAllReduce || kind == CallKind::kReduceScatter ||
      kind == CallKind::kReduceRanges) {
    text += fmt::format(", op {}", reduce_op_name(static_cast<ReduceOp>(m.op)));
  }
  if (kind == CallKind::kBroadcast) text += fmt::format(", root {}", m.aux);
  if (kind == CallKind::kAllReduce && m.aux > 0 && m.aux <= kNumAllReduceAlgorithms) {
    text += fmt::format(", schedule forced to {}",
                        all_reduce_algorithm_name(static_cast<AllReduceAlgorithm>(m.aux - 1)));
  } else if (kind == CallKind::kAllReduce && m.aux != 0) {
    text += fmt::format(", schedule {}", m.aux);
  }
  if (kind == CallKind::kReduceRanges || kind == CallKind::kGatherRanges) {
    text += fmt::format(", bounds digest {:#x}", static_cast<uint32_t>(m.aux));
  }
  return text;
}

bool same_call(const shm::Mailbox& a, const shm::Mailbox& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.op == b.op && a.n_elems == b.n_elems &&
         a.call_seq == b.call_seq && a.aux == b.aux;
}

// The record's name: `operation` NUL-padded, not NUL-ended.
void set_record_name(shm::CallRecord& record, const char* operation) {
  const size_t name_bytes = strnlen(operation, sizeof record.name);
  std::memcpy(record.name, operation, name_bytes);
  std::memset(record.name + name_bytes, 0, sizeof record.name - name_bytes);
}

}  // namespace

const char* call_kind_name(CallKind kind) {
  switch (kind) {
    case CallKind::kAllReduce:
      return "all_reduce";
    case CallKind::kBroadcast:
      return "broadcast";
    case CallKind::kAllGather:
      return "all_gather";
    case CallKind::kReduceScatter:
      return "reduce_scatter";
    case CallKind::kBarrier:
      return "barrier";
    case CallKind::kRendezvous:
      return "rendezvous";
    case CallKind::kReduceRanges:
      return "reduce_ranges";
    case CallKind::kGatherRanges:
      return "gather_ranges";
  }
  return "unknown collective";
}

Rounds::Rounds(Segment segment, int64_t timeout_ms)
    : segment_(std::move(segment)),
      waiter_(segment_, timeout_ms),
      half_bytes_(segment_.staging_bytes() / 2 / shm::kCacheLineBytes * shm::kCacheLineBytes),
      sources_(static_cast<size_t>(segment_.world_size()), nullptr),
      fork_epoch_(fork_epoch()) {}

void Rounds::check_not_poisoned() const {
  // Every read of peers' data comes before the poison word's load (the peer poisons before it
  // returns, and only then may change its operand).
  std::atomic_thread_fence(std::memory_order_acquire);
  if (auto poisoned = segment_.poison_message()) {
    throw PeerFailure(fmt::format("{} on ordinal {}: {} (this call's result is not used)",
                                  operation_, ordinal(), *poisoned));
  }
}

void Rounds::check_can_begin(const char* operation) const {
  // A forked child shares the parent's mailboxes: a call of its own would take the parent's
  // turn and leave the replicas reducing different rounds, silently.
  if (fork_epoch() != fork_epoch_) {
    throw InvalidArgument(fmt::format(
        "{}: this process was forked from ordinal {}'s, which owns the communicator; only that "
        "process may call its collectives",
        operation, ordinal()));
  }
  // A replica that arrives after a peer gave up on it must not complete the call on the
  // rounds that peer posted before it poisoned the segment: the job is failing.
  if (auto poisoned = segment_.poison_message()) {
    throw PeerFailure(fmt::format("{} on ordinal {}: {}", operation, ordinal(), *poisoned));
  }
}

void Rounds::begin_call(const char* operation, const CallHeader& header) {
  // One call at a time: a second thread's call would interleave its rounds with the first's,
  // and the replicas would pair up calls of different threads, silently.
  if (in_call_.exchange(true, std::memory_order_acquire)) {
    throw InvalidArgument(fmt::format(
        "{}: ordinal {} is already inside a collective call on another thread; a communicator "
        "takes one call at a time (serialise the threads' calls)",
        operation, ordinal()));
  }
  try {
    check_can_begin(operation);
  } catch (...) {
    leave_call();
    throw;
  }
  operation_ = operation;
  header_ = header;
  ++call_seq_;
  check_pending_ = true;
  // The hang report's view of this ordinal (plain relaxed stores: a few nanoseconds a call).
  shm::CallRecord& record = segment_.slot(ordinal()).call;
  set_record_name(record, operation);
  record.dtype.store(static_cast<uint8_t>(header.dtype), std::memory_order_relaxed);
  record.n_elems.store(header.n_elems, std::memory_order_relaxed);
  const uint64_t graph = running_graph_hash.load(std::memory_order_relaxed);
  record.graph_hash.store(graph, std::memory_order_relaxed);
  // A step's first collective: where a replica's lateness for the step shows (the later ones
  // of the step follow it closely, and their last arrival is mostly chance).
  const uint64_t step = graph_steps.load(std::memory_order_relaxed);
  step_start_ = graph != 0 && step != counted_step_;
  if (step_start_) counted_step_ = step;
  const int64_t now_ns = record_time_ns(std::chrono::steady_clock::now());
  record.started_ns.store(now_ns, std::memory_order_relaxed);
  started_us_ = static_cast<uint64_t>(now_ns) / 1000;
  record.returned.store(0, std::memory_order_relaxed);
  record.seq.store(call_seq_, std::memory_order_release);
}

void Rounds::leave_call() const { in_call_.store(false, std::memory_order_release); }

void Rounds::end_call() const {
  segment_.slot(ordinal()).call.returned.store(1, std::memory_order_release);
}

void Rounds::begin_network_phase(const char* operation, std::optional<DType> dtype,
                                 size_t n_elems) const {
  shm::CallRecord& record = segment_.slot(ordinal()).call;
  record.between_nodes.store(0, std::memory_order_relaxed);  // the fields below change
  set_record_name(record, operation);
  record.dtype.store(dtype ? static_cast<uint8_t>(*dtype) : uint8_t{0xff},  // 0xff: none
                     std::memory_order_relaxed);
  record.n_elems.store(n_elems, std::memory_order_relaxed);
  record.graph_hash.store(running_graph_hash.load(std::memory_order_relaxed),
                          std::memory_order_relaxed);
  const int64_t now_ns = record_time_ns(std::chrono::steady_clock::now());
  record.started_ns.store(now_ns, std::memory_order_relaxed);
  record.waiting_since_ns.store(now_ns, std::memory_order_relaxed);
  record.awaited.store(-1, std::memory_order_relaxed);
  record.between_nodes.store(1, std::memory_order_release);
}

void Rounds::end_network_phase() const {
  shm::CallRecord& record = segment_.slot(ordinal()).call;
  record.waiting_since_ns.store(0, std::memory_order_relaxed);
  record.returned.store(1, std::memory_order_relaxed);  // between calls again
  record.between_nodes.store(0, std::memory_order_release);
}

void Rounds::sync() {
  const uint64_t round = ++round_;
  const int parity = static_cast<int>(round & 1);
  shm::Mailbox& mine = segment_.slot(ordinal()).mailbox[parity];
  mine.kind = static_cast<uint8_t>(header_.kind);
  mine.dtype = static_cast<uint8_t>(header_.dtype);
  mine.op = static_cast<uint8_t>(header_.op);
  mine.n_elems = header_.n_elems;
  mine.call_seq = call_seq_;
  mine.aux = header_.aux;
  mine.arrived_us = static_cast<uint32_t>(started_us_);  // wrapped: peers compare differences
  mine.in_arena = header_.in_arena ? 1 : 0;
  post(mine, round);
  // The timeline's view of the call's first round: how long this replica waited for the last.
  const int64_t wait_start = check_pending_ && trace_on.load(std::memory_order_relaxed) ? trace::now_ns() : 0;
  wait_all(round, parity);
  if (wait_start != 0) trace::record("wait for peers", "wait", wait_start, trace::now_ns());
  if (check_pending_) {
    check_pending_ = false;
    check_call(parity);
  }
}

bool Rounds::all_in_arena(int parity) const {
  for (int j = 0; j < world_size(); ++j) {
    if (segment_.slot(j).mailbox[parity].in_arena != 1) return false;
  }
  return true;
}

bool Rounds::any_in_arena(int parity) const {
  for (int j = 0; j < world_size(); ++j) {
    if (segment_.slot(j).mailbox[parity].in_arena == 1) return true;
  }
  return false;
}

void Rounds::post(shm::Mailbox& mine, uint64_t round) {
  if (segment_.spin_allowed()) {
    publish(segment_, mine.round, static_cast<uint32_t>(round));
    return;
  }
  mine.round.store(static_cast<uint32_t>(round), std::memory_order_release);
  shm::ControlBlock& control = segment_.control();
  const uint64_t arrivals = control.barrier_count.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (arrivals == round * static_cast<uint64_t>(world_size())) {
    publish(segment_, control.barrier_round, static_cast<uint32_t>(round));
  }
}

void Rounds::wait_all(uint64_t round, int parity) {
  const auto target = static_cast<uint32_t>(round);
  const int n = world_size();
  const int me = ordinal();
  const Segment& segment = segment_;
  if (segment.spin_allowed()) {
    waiter_.wait(operation_, [&]() -> Awaited {
      for (int j = 0; j < n; ++j) {
        const auto& word = segment.slot(j).mailbox[parity].round;
        if (j != me && !reached(word.load(std::memory_order_acquire), target)) {
          return {&word, j};
        }
      }
      return {};
    });
    return;
  }
  // Oversubscribed: only the central word is probed (scanning every mailbox costs a cache
  // miss per peer); who is late is worked out only for liveness checks and errors.
  const auto& barrier = segment.control().barrier_round;
  waiter_.wait(
      operation_,
      [&]() -> Awaited {
        if (reached(barrier.load(std::memory_order_acquire), target)) return {};
        return {&barrier, -1};
      },
      [&] {
        for (int j = 0; j < n; ++j) {
          const auto& word = segment.slot(j).mailbox[parity].round;
          if (!reached(word.load(std::memory_order_acquire), target)) return j;
        }
        return -1;  // everyone posted; the last arrival is about to publish
      });
}

// The first round of a call: every ordinal's header and arrival time for it are published
// (and stay until their owners start round + 2), so each ordinal checks the headers and finds
// the last arrival from the same data; the last one alone counts itself, in its own slot.
void Rounds::check_call(int parity) {
  const shm::Mailbox& mine = segment_.slot(ordinal()).mailbox[parity];
  bool last = true;
  int32_t first = 0, latest = 0;  // the earliest and latest arrivals, relative to mine
  for (int j = 0; j < world_size(); ++j) {
    const shm::Mailbox& theirs = segment_.slot(j).mailbox[parity];
    if (j == ordinal()) continue;
    if (!same_call(mine, theirs)) {
      throw PeerFailure(
          fmt::format("{}: mismatched collective calls: ordinal {} called {}; "
                      "ordinal {} called {}",
                      operation_, ordinal(), describe(mine), j, describe(theirs)));
    }
    const auto relative = static_cast<int32_t>(theirs.arrived_us - mine.arrived_us);
    first = std::min(first, relative);
    latest = std::max(latest, relative);
    if (relative > 0 || (relative == 0 && j > ordinal())) last = false;
  }
  // Plain load-and-store increments: the ordinal is its counters' only writer.
  const auto bump = [](std::atomic<uint64_t>& counter, uint64_t by) {
    counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  };
  shm::ArrivalCounts& all = segment_.slot(ordinal()).arrivals;
  shm::ArrivalGroup& counts = step_start_ ? all.steps : all.other;
  if (step_start_) {
    if (counts.calls.load(std::memory_order_relaxed) == 0) {
      all.first_step_us.store(started_us_, std::memory_order_relaxed);
    }
    all.last_step_us.store(started_us_, std::memory_order_relaxed);
  }
  bump(counts.calls, 1);
  const int32_t spread = latest - first;
  if (world_size() == 1 || spread < static_cast<int32_t>(shm::kLateArrivalUs)) return;
  bump(counts.waited, 1);
  if (!last) return;
  bump(counts.last, 1);
  bump(counts.late_us, static_cast<uint64_t>(spread));
}

}  // namespace xs::detail
