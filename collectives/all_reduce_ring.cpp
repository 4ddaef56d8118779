// Ring all-reduce: the reference schedule (reduce-scatter then all-gather around the ring).
#include <algorithm>
#include <cstring>

#include "xla_spawn/collectives/detail/schedules.h"
#include "xla_spawn/collectives/reduce.h"

namespace xs::detail {
namespace {

// Slots per ordinal: how many ring steps a sender may run ahead of its successor.
constexpr uint32_t kRingSlots = 4;

// One ordinal's view of the ring: its predecessor sends to it, it sends to its successor,
// through slot (step % kRingSlots) of the sender's staging area.
class RingLink {
 public:
  RingLink(Rounds& rounds, size_t slot_bytes)
      : rounds_(rounds),
        me_(rounds.ordinal()),
        pred_((me_ + rounds.world_size() - 1) % rounds.world_size()),
        succ_((me_ + 1) % rounds.world_size()),
        slot_bytes_(slot_bytes) {}

  // My slot for `step`, once my successor has consumed what it held (step - kRingSlots).
  std::byte* send_slot(uint32_t step) {
    const auto& acked = rounds_.segment().slot(succ_).ring_acked.value;
    const uint32_t target = step + 1 - kRingSlots;
    rounds_.waiter().wait(rounds_.operation(), [&]() -> Awaited {
      if (reached(acked.load(std::memory_order_acquire), target)) return {};
      return {&acked, succ_};
    });
    return slot(me_, step);
  }
  void sent(uint32_t step) {
    publish(rounds_.segment(), rounds_.segment().slot(me_).ring_sent.value, step + 1);
  }
  // My predecessor's slot for `step`, once it has been published.
  const std::byte* receive_slot(uint32_t step) {
    const auto& sent = rounds_.segment().slot(pred_).ring_sent.value;
    rounds_.waiter().wait(rounds_.operation(), [&]() -> Awaited {
      if (reached(sent.load(std::memory_order_acquire), step + 1)) return {};
      return {&sent, pred_};
    });
    return slot(pred_, step);
  }
  void received(uint32_t step) {
    publish(rounds_.segment(), rounds_.segment().slot(me_).ring_acked.value, step + 1);
  }
  // Returns once the successor has consumed every step before `end_step`.
  void drain(uint32_t end_step) { send_slot(end_step - 1 + kRingSlots); }

 private:
  std::byte* slot(int ordinal, uint32_t step) const {
    return rounds_.staging_area(ordinal) + (step % kRingSlots) * slot_bytes_;
  }

  Rounds& rounds_;
  int me_, pred_, succ_;
  size_t slot_bytes_;
};

}  // namespace

// Ring schedule (the reference). The buffer is cut into slabs of N chunks, each chunk
// small enough for one ring slot. Reduce-scatter: at step s (0..N-2) ordinal r sends its
// partial of chunk (r - s) mod N to ordinal r + 1 and receives the partial of chunk
// (r - s - 1) mod N from r - 1, which it combines with its own elements and sends on at the
// next step; after N - 1 steps ordinal r holds chunk (r + 1) mod N fully reduced, having
// accumulated it in ring order (r + 2, r + 3, ..., r + 1: the same order on every ordinal,
// since the result travels on unchanged). All-gather: N - 1 more steps pass the reduced
// chunks on around the ring. Partials travel in accumulator precision (f32 for bf16), and
// each receive's result goes straight into the slot of the next send. kRingSlots slots per
// ordinal let a sender run ahead of its successor, which pipelines consecutive slabs.
// Each ordinal moves 2(N-1)/N of the buffer through shared memory, but a slab needs
// 2(N-1) dependent hops, each a wake-up when replicas outnumber cores.
void all_reduce_ring(Rounds& rounds, std::byte* data, size_t n_elems, DType dtype, ReduceOp op) {
  const int n = rounds.world_size();
  const int me = rounds.ordinal();
  rounds.sync();  // header check; also no peer still reads our staging from earlier rounds
  const size_t elem_bytes = dtype_size(dtype);
  const size_t acc_bytes = accumulator_size(dtype);
  const size_t slot_bytes = rounds.segment().staging_bytes() / kRingSlots / 64 * 64;
  const size_t slot_elems = slot_bytes / acc_bytes;
  const size_t line_elems = shm::kCacheLineBytes / elem_bytes;
  const size_t slab_elems = static_cast<size_t>(n) * (slot_elems / line_elems * line_elems);
  RingLink link(rounds, slot_bytes);
  uint32_t& step = rounds.ring_step();
  for (size_t offset = 0; offset < n_elems; offset += slab_elems) {
    const size_t count = std::min(slab_elems, n_elems - offset);
    const size_t chunk = chunk_elems(count, n, elem_bytes);
    auto chunk_data = [&](int c) { return data + (offset + chunk * c) * elem_bytes; };
    auto chunk_count = [&](int c) {
      const size_t begin = std::min(count, chunk * c);
      return std::min(count, begin + chunk) - begin;
    };
    ring_start(link.send_slot(step), chunk_data(me), chunk_count(me), dtype);
    link.sent(step);
    for (int s = 0; s < 2 * (n - 1); ++s, ++step) {
      const int c = ((me - s - 1) % n + n) % n;  // the chunk arriving at this step
      const std::byte* in = link.receive_slot(step);
      const bool last = s == 2 * (n - 1) - 1;
      std::byte* out = last ? nullptr : link.send_slot(step + 1);
      if (s < n - 2) {
        ring_accumulate(out, in, chunk_data(c), chunk_count(c), dtype, op);
      } else if (s == n - 2) {
        ring_finish(chunk_data(c), out, in, chunk_data(c), chunk_count(c), dtype, op, n);
      } else {
        const int g = s - (n - 1);
        const int arriving = ((me - g) % n + n) % n;
        std::memcpy(chunk_data(arriving), in, chunk_count(arriving) * elem_bytes);
        if (!last) std::memcpy(out, in, chunk_count(arriving) * elem_bytes);
      }
      link.received(step);
      if (!last) link.sent(step + 1);
    }
  }
  link.drain(step);
}

}  // namespace xs::detail
