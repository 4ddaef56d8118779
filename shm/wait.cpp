#include "xla_spawn/shm/wait.h"

#include <algorithm>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/shm/call_report.h"
#include "xla_spawn/shm/futex.h"

namespace xs {
namespace {

using Clock = std::chrono::steady_clock;

thread_local InterruptCheck t_interrupt_check = nullptr;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string describe_peer(const Segment& segment, int ordinal) {
  if (ordinal < 0) return "a peer";
  const int32_t pid = segment.slot(ordinal).pid.load(std::memory_order_acquire);
  if (pid == 0) return fmt::format("ordinal {} (never checked in)", ordinal);
  return fmt::format("ordinal {} (pid {})", ordinal, pid);
}

}  // namespace

void set_thread_interrupt_check(InterruptCheck check) { t_interrupt_check = check; }

int64_t collective_timeout_ms_from_env() {
  return env_int(kCollectiveTimeoutEnv, 1, 86'400'000).value_or(kDefaultCollectiveTimeoutMs);
}

WaitBudget wait_budget_from_env() {
  const int64_t spin_us = env_int(kSpinEnv, 0, 1'000'000).value_or(kDefaultSpinNs / 1000);
  const int64_t yield_us = env_int(kYieldEnv, 0, 1'000'000).value_or(kDefaultYieldNs / 1000);
  return {spin_us * 1000, yield_us * 1000};
}

Waiter::Waiter(const Segment& segment, int64_t timeout_ms)
    : segment_(&segment), timeout_ms_(timeout_ms) {
  const WaitBudget budget = wait_budget_from_env();
  spin_ns_ = segment.spin_allowed() ? budget.spin_ns : 0;
  yield_ns_ = segment.spin_allowed() ? 0 : budget.yield_ns;
}

void Waiter::wait_slow(const char* operation, const std::function<Awaited()>& probe,
                       const std::function<int()>& blame) {
  const Segment& segment = *segment_;
  shm::ControlBlock& control = segment.control();
  const auto start = Clock::now();
  auto deadline = start + std::chrono::milliseconds(timeout_ms_);
  auto last_check = start;
  // The hang report reads how long this ordinal has slept here, and for whom.
  shm::CallRecord& record = segment.slot(segment.ordinal()).call;
  record.waiting_since_ns.store(record_time_ns(start), std::memory_order_relaxed);
  record.awaited.store(-1, std::memory_order_relaxed);
  // Cleared on return only: a wait that failed stays in the record, for the report that
  // follows its failure.
  auto done = [&record] {
    record.waiting_since_ns.store(0, std::memory_order_relaxed);
    record.awaited.store(-1, std::memory_order_relaxed);
  };
  // Not at once: most waits end within microseconds, and reading /proc costs more than that.
  auto next_liveness_check = start + std::chrono::milliseconds(kPollIntervalMs);
  auto next_interrupt_check = start + kInterruptCheckInterval;
  bool signalled = false;  // a signal handler ran during the last sleep
  for (;;) {
    Awaited awaited = probe();
    if (awaited.word == nullptr) return done();
    auto culprit = [&] { return awaited.ordinal >= 0 ? awaited.ordinal : blame(); };
    if (auto poisoned = segment.poison_message()) {
      throw PeerFailure(fmt::format("{} on ordinal {}: {} (had waited {:.3f} s for {})", operation,
                                    segment.ordinal(), *poisoned, seconds_since(start),
                                    describe_peer(segment, culprit())));
    }
    const auto now = Clock::now();
    // A check comes at least every slice unless this process did not run: stopped (Ctrl-Z
    // stops the job with xla-spawn; SIGSTOP) or a paused VM. Time it could not wait is not
    // waited: the deadline moves by the gap, so a job continued after a long stop goes on.
    if (const auto gap = now - last_check; gap > kStoppedGap) {
      deadline += gap - std::chrono::milliseconds(kPollIntervalMs);
    }
    last_check = now;
    if (t_interrupt_check != nullptr && (signalled || now >= next_interrupt_check)) {
      next_interrupt_check = now + kInterruptCheckInterval;
      try {
        t_interrupt_check();
      } catch (...) {
        const int blamed = culprit();
        record.awaited.store(blamed, std::memory_order_relaxed);
        segment.poison(fmt::format("{} on ordinal {}: interrupted after {:.3f} s waiting for {}",
                                   operation, segment.ordinal(), seconds_since(start),
                                   describe_peer(segment, blamed)));
        throw;
      }
    }
    if (now >= deadline) {
      const int blamed = culprit();
      record.awaited.store(blamed, std::memory_order_relaxed);  // what the report will say
      const std::string message = fmt::format(
          "{} on ordinal {}: timed out after {:.3f} s waiting for {} (timeout {} ms, set by {})",
          operation, segment.ordinal(), seconds_since(start), describe_peer(segment, blamed),
          timeout_ms_, kCollectiveTimeoutEnv);
      segment.poison(message);
      throw Timeout(message);
    }
    if (now >= next_liveness_check && (awaited.ordinal = culprit()) >= 0) {
      next_liveness_check = now + std::chrono::milliseconds(kPollIntervalMs);
      const shm::OrdinalSlot& slot = segment.slot(awaited.ordinal);
      const int32_t pid = slot.pid.load(std::memory_order_acquire);
      // A peer whose communicator ended (shutdown(), or its Segment destroyed) will not come,
      // though its process may run on.
      const bool left =
          slot.state.load(std::memory_order_acquire) == static_cast<uint32_t>(shm::SlotState::kLeft);
      if (left || (pid != 0 && !process_alive(pid))) {
        // It may have posted what this wait wants and then left, after the probe above read
        // its word: seen left (acquire), its post is visible now.
        if (probe().word == nullptr) return done();
        const std::string message = fmt::format(
            "{} on ordinal {}: ordinal {} (pid {}) {}; waited {:.3f} s for it", operation,
            segment.ordinal(), awaited.ordinal, pid,
            left ? "has left the job (its communicator was shut down)" : "is gone",
            seconds_since(start));
        segment.poison(message);
        throw PeerFailure(message);
      }
    }
    // The probe names the awaited ordinal only when it is cheap to; the liveness check finds it
    // otherwise. The record keeps the last one known rather than flipping back to -1.
    if (awaited.ordinal >= 0) record.awaited.store(awaited.ordinal, std::memory_order_relaxed);
    const int64_t slice_ns = std::min<int64_t>(
        kPollIntervalMs * 1'000'000,
        std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count());
    control.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = awaited.word->load(std::memory_order_seq_cst);
    signalled = probe().word == awaited.word && !segment.poison_message() &&
                futex_wait(awaited.word, seen, slice_ns);
    control.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace xs
