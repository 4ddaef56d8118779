#include "xla_spawn/collectives/detail/rounds.h"

#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/base/running_graph.h"
#include "xla_spawn/shm/call_report.h"
#include "xla_spawn/shm/futex.h"

namespace xs::detail {
namespace {

std::string describe(const shm::Mailbox& m) {
  const auto kind = static_cast<CallKind>(m.kind);
  std::string text = fmt::format("{} #{} with {} elements of {}", call_kind_name(kind), m.call_seq,
                                 m.n_elems, dtype_name(static_cast<DType>(m.dtype)));
  if (kind == CallKind::kAllReduce || kind == CallKind::kReduceScatter ||
      kind == CallKind::kReduceRanges) {
    text += fmt::format(", op {}", reduce_op_name(static_cast<ReduceOp>(m.op)));
  }
  if (kind == CallKind::kBroadcast) text += fmt::format(", root {}", m.aux);
  if (kind == CallKind::kReduceRanges || kind == CallKind::kGatherRanges) {
    text += fmt::format(", bounds digest {:#x}", static_cast<uint32_t>(m.aux));
  }
  return text;
}

bool same_call(const shm::Mailbox& a, const shm::Mailbox& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.op == b.op && a.n_elems == b.n_elems &&
         a.call_seq == b.call_seq && a.aux == b.aux;
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
      sources_(static_cast<size_t>(segment_.world_size()), nullptr) {}

void Rounds::begin_call(const char* operation, const CallHeader& header) {
  // A replica that arrives after a peer gave up on it must not complete the call on the
  // rounds that peer posted before it poisoned the segment: the job is failing.
  if (auto poisoned = segment_.poison_message()) {
    throw PeerFailure(fmt::format("{} on ordinal {}: {}", operation, ordinal(), *poisoned));
  }
  operation_ = operation;
  header_ = header;
  ++call_seq_;
  check_pending_ = true;
  // The hang report's view of this ordinal (plain relaxed stores: a few nanoseconds a call).
  shm::CallRecord& record = segment_.slot(ordinal()).call;
  const size_t name_bytes = strnlen(operation, sizeof record.name);  // NUL-padded, not ended
  std::memcpy(record.name, operation, name_bytes);
  std::memset(record.name + name_bytes, 0, sizeof record.name - name_bytes);
  record.dtype.store(static_cast<uint8_t>(header.dtype), std::memory_order_relaxed);
  record.n_elems.store(header.n_elems, std::memory_order_relaxed);
  record.graph_hash.store(running_graph_hash.load(std::memory_order_relaxed),
                          std::memory_order_relaxed);
  record.started_ns.store(record_time_ns(std::chrono::steady_clock::now()),
                          std::memory_order_relaxed);
  record.seq.store(call_seq_, std::memory_order_release);
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
  mine.in_arena = header_.in_arena ? 1 : 0;
  post(mine, round);
  wait_all(round, parity);
  if (check_pending_) {
    check_pending_ = false;
    check_headers(parity);
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

void Rounds::check_headers(int parity) const {
  const shm::Mailbox& mine = segment_.slot(ordinal()).mailbox[parity];
  for (int j = 0; j < world_size(); ++j) {
    const shm::Mailbox& theirs = segment_.slot(j).mailbox[parity];
    if (j == ordinal() || same_call(mine, theirs)) continue;
    throw PeerFailure(
        fmt::format("{}: mismatched collective calls: ordinal {} called {}; "
                    "ordinal {} called {}",
                    operation_, ordinal(), describe(mine), j, describe(theirs)));
  }
}

}  // namespace xs::detail
