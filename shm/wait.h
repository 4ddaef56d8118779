#pragma once
// Waiting for peers on the segment's futex words, always with a deadline: a bounded spin
// when every replica has a core (none when replicas outnumber cores, which instead poll
// with sched_yield() for a bounded time: every yield hands the core to a runnable replica,
// so nobody's time is burnt), then FUTEX_WAIT in slices of kPollIntervalMs, after each of
// which the poisoned word, the deadline and the awaited peer's process are checked. Time the
// waiter spent stopped (a gap of over kStoppedGap between checks) does not count.
//
//   xs::Waiter waiter(segment, xs::collective_timeout_ms_from_env());
//   waiter.wait("all_reduce", [&]() -> xs::Awaited {
//     if (ready()) return {};                      // done
//     return {&peer_word, peer_ordinal};           // sleep on this word, blame this ordinal
//   });
//   xs::publish(segment, my_word, round);          // the other side
//
// Memory ordering contract: a publisher writes its data with plain stores, then publish()
// stores the word with release (in fact seq_cst) semantics; a waiter whose probe loads the
// word with acquire and sees the new value also sees that data. The sleeper count and the
// word form a Dekker pair (both seq_cst): either the publisher sees a sleeper and calls
// FUTEX_WAKE, or the sleeper's FUTEX_WAIT sees the new value and returns at once.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>

#include <immintrin.h>
#include <sched.h>

#include "xla_spawn/shm/futex.h"
#include "xla_spawn/shm/segment.h"

namespace xs {

inline constexpr const char* kCollectiveTimeoutEnv = "XLA_SPAWN_COLLECTIVE_TIMEOUT_MS";
inline constexpr int64_t kDefaultCollectiveTimeoutMs = 60'000;
// Sleep slice: how late a poisoned segment or a dead peer may be noticed at worst.
inline constexpr int64_t kPollIntervalMs = 50;
// Longer than this between two checks of a wait, the waiter was not running (stopped, a VM
// paused): the gap does not count towards the timeout.
inline constexpr std::chrono::milliseconds kStoppedGap{1000};
// Spin before sleeping, when spinning is allowed (XLA_SPAWN_SPIN_US overrides): a peer on
// another core answers within a microsecond; spinning on keeps a late peer from costing a
// futex wake-up, which on a busy machine can take a scheduler slice (hundreds of us).
inline constexpr const char* kSpinEnv = "XLA_SPAWN_SPIN_US";
inline constexpr int64_t kDefaultSpinNs = 1'000'000;
// Oversubscribed (replicas outnumber cores): poll with sched_yield() this long before
// sleeping (XLA_SPAWN_YIELD_US overrides; 0 = sleep at once). A futex sleep costs every
// replica a wake-up per collective; yielding lets the late replicas run instead. Measured
// at N = 8 on 2 cores (all_reduce_sweep, median): 8-byte latency 20.3 us sleeping at once,
// 7.3 us with 50 us of yields, 5.9 us with 200 us; busbw at 128 KiB 2.2 -> 2.9 GB/s.
inline constexpr const char* kYieldEnv = "XLA_SPAWN_YIELD_US";
inline constexpr int64_t kDefaultYieldNs = 200'000;

// A check the calling thread's slow waits make after a signal handler interrupts their sleep,
// and at least every kInterruptCheckInterval. It may throw to give the wait up: the segment is
// poisoned first (the peers fail with PeerFailure instead of waiting for a call that will not
// come), then the exception goes on to the caller. The Python module sets one on the main
// thread that runs Python's signal handlers, so that Ctrl-C raises KeyboardInterrupt inside a
// collective. nullptr (the default): none.
using InterruptCheck = void (*)();
void set_thread_interrupt_check(InterruptCheck check);
// Short enough that a signal taken while spinning (no EINTR to see) is heard at once to a
// person; long enough that a wait rarely pays for a check (the Python module's takes the GIL).
inline constexpr std::chrono::milliseconds kInterruptCheckInterval{100};

// XLA_SPAWN_COLLECTIVE_TIMEOUT_MS (1 ms .. 1 day) or kDefaultCollectiveTimeoutMs.
int64_t collective_timeout_ms_from_env();
// XLA_SPAWN_SPIN_US and XLA_SPAWN_YIELD_US (0 .. 1 s each, in ns), or their defaults; both
// are read whichever applies, so that a bad value is an error on every machine.
struct WaitBudget {
  int64_t spin_ns;
  int64_t yield_ns;
};
WaitBudget wait_budget_from_env();

// What a wait is blocked on: the futex word whose change may end it and the ordinal that
// must change it (-1: not known cheaply; the wait's `blame` function finds it when needed).
// A default-constructed Awaited means "condition holds".
struct Awaited {
  const std::atomic<uint32_t>* word = nullptr;
  int ordinal = -1;
};

// Stores `value` into `word` and wakes its sleepers (the system call only when any exist).
inline void publish(const Segment& segment, std::atomic<uint32_t>& word, uint32_t value) {
  word.store(value, std::memory_order_seq_cst);
  if (segment.control().sleepers.load(std::memory_order_seq_cst) != 0) [[unlikely]] {
    futex_wake_all(&word);
  }
}

class Waiter {
 public:
  Waiter(const Segment& segment, int64_t timeout_ms);

  int64_t timeout_ms() const { return timeout_ms_; }

  // Returns when probe() returns an empty Awaited. Throws xs::Timeout (deadline passed) or
  // xs::PeerFailure (segment poisoned, awaited peer's process gone), naming `operation`,
  // the awaited ordinal and the time waited; both poison the segment first.
  template <class Probe>
  void wait(const char* operation, Probe&& probe) {
    wait(operation, probe, [] { return -1; });
  }
  // As above; blame() names the ordinal waited for when probe() cannot say cheaply. It is
  // called only for liveness checks and error messages.
  template <class Probe, class Blame>
  void wait(const char* operation, Probe&& probe, Blame&& blame) {
    if (probe().word == nullptr) [[likely]]
      return;
    if (spin_ns_ > 0 && spin(probe)) return;
    if (yield_ns_ > 0) {
      const auto start = std::chrono::steady_clock::now();
      do {
        sched_yield();
        if (probe().word == nullptr) return;
      } while (std::chrono::steady_clock::now() - start < std::chrono::nanoseconds(yield_ns_));
    }
    wait_slow(operation, std::function<Awaited()>(std::ref(probe)),
              std::function<int()>(std::ref(blame)));
  }

 private:
  template <class Probe>
  bool spin(Probe& probe) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        _mm_pause();
        if (probe().word == nullptr) return true;
      }
      if (std::chrono::steady_clock::now() - start > std::chrono::nanoseconds(spin_ns_)) {
        return false;
      }
    }
  }
  void wait_slow(const char* operation, const std::function<Awaited()>& probe,
                 const std::function<int()>& blame);

  const Segment* segment_;
  int64_t timeout_ms_;
  int64_t spin_ns_;   // 0 when replicas outnumber cores
  int64_t yield_ns_;  // 0 when every replica has a core
};

}  // namespace xs
