#pragma once
// The hang report: what every ordinal of a job is doing, from the call records its replicas
// keep in their segment slots (shm::CallRecord: the latest collective call, when it began, and
// the wait inside it) and each process's state in /proc. The launcher prints it on SIGUSR1 and
// when a collective times out; "held up by" names the ordinals others wait for, in the same or
// an earlier call, that are not asleep in a wait themselves (stopped, gone, computing, or
// stuck elsewhere).
//
//   xla-spawn: hang report (SIGUSR1):
//     ordinal 0 (pid 1801, sleeping): reduce_scatter #22 (f32, 334853 elements, graph
//       39839d245a2d16aa) for 1.0 s, waiting 1.0 s for ordinal 1        (one line each)
//     ordinal 1 (pid 1802, stopped): reduce_scatter #22 (...) for 1.0 s, not waiting
//     held up by ordinal(s) 1 (stopped)
//   or, for an ordinal whose latest call has returned (computing, loading data):
//     ordinal 1 (pid 1802, running): between collective calls, the latest reduce_scatter #21
//       (...) began 1.2 s ago
//
// Reads racily what running replicas write: a torn or scribbled record garbles one line, never
// more (what becomes an index, a name or a dtype is range-checked; a time need only be past).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace xs {

// A call record's times (started_ns, waiting_since_ns): CLOCK_MONOTONIC in nanoseconds, the
// clock every process of the node shares.
inline int64_t record_time_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

struct OrdinalCall {
  int ordinal = 0;
  pid_t pid = 0;
  pid_t slot_pid = 0;         // the process checked in as the ordinal (pid or a descendant)
  bool dumps_stack = false;   // slot_pid handles stack_dump_signal()
  char state = '\0';  // /proc/<pid>/stat's letter, '\0' when the process is gone
  uint64_t seq = 0;   // 0: no collective call yet
  bool returned = false;  // call `seq` has returned: the ordinal is between calls
  bool between_nodes = false;  // in the network phase of the multi-node call `name`
  std::string name;
  std::string dtype;  // empty when the record's dtype is out of range
  uint64_t n_elems = 0;
  uint64_t graph_hash = 0;
  double seconds_in_call = 0;  // since call `seq` began
  double seconds_waiting = -1;  // < 0: not inside a wait's sleep (or was not when it died)
  int awaited = -1;
  // Arrivals (shm::ArrivalCounts): at each training step's first collective, and at the
  // other calls.
  struct Arrivals {
    uint64_t calls = 0;    // calls whose first round it completed
    uint64_t waited = 0;   // of which waited for a late arrival
    uint64_t last = 0;     // of those, the ones it arrived at last
    uint64_t late_us = 0;  // summed over those: how long after the first arrival
  };
  Arrivals steps;
  Arrivals other;
  double step_ms = 0;  // mean time from one counted step's arrival to the next; 0: unknown
};

// The call records of the `world_size` slots of the segment mapped at `base` (valid for
// `mapped_bytes`), with pids[k] the launcher's pid of ordinal k (0 or missing: the slot's own).
// A replica that died inside a wait keeps its record's wait: the report shows what it waited
// for when it failed.
std::vector<OrdinalCall> read_calls(const void* base, size_t mapped_bytes, int world_size,
                                    std::span<const pid_t> pids);

// The report's lines (each indented by two spaces), the last "held up by ..." when any
// ordinal is waited for and not waiting itself. `first_ordinal` turns local ordinals into the
// job's (multi-node jobs); `spans_nodes` (a multi-node job) adds the link to the other nodes
// to what the straggler line asks to check.
std::string format_calls(const std::vector<OrdinalCall>& calls, int first_ordinal,
                         bool spans_nodes = false);

// The straggler report: "ordinal 3 arrived last at 81% of the 420 training steps that waited
// (of 500), 0.80 ms after the first on average, in steps of 4.1 ms: ..." when one ordinal
// arrived last at more than half of the steps (their first collective) that waited for a late
// arrival (more than three quarters with two replicas), at least kStragglerMinCalls of them,
// far more often than chance would have it (below kStragglerChance of happening if every
// ordinal were equally likely to be last), and late by at least kStragglerMinShare of a
// step on average; nullopt otherwise. A job with fewer steps that waited (no runtime
// programs: eager collectives) is judged on all its calls, without the step-share rule.
inline constexpr uint64_t kStragglerMinCalls = 20;
inline constexpr double kStragglerChance = 1e-3;
inline constexpr double kStragglerMinShare = 0.1;
// P(X >= k) for X ~ Binomial(n, p).
double binomial_tail(uint64_t n, uint64_t k, double p);
// Between nodes (`spans_nodes`) a replica's exchange with the other nodes delays its next
// arrival too, so the line names its link among the things to check.
std::optional<std::string> straggler_line(const std::vector<OrdinalCall>& calls, int first_ordinal,
                                          bool spans_nodes = false);

}  // namespace xs
