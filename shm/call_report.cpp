#include "xla_spawn/shm/call_report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "xla_spawn/base/dtype.h"
#include "xla_spawn/shm/control_block_check.h"
#include "xla_spawn/shm/futex.h"
#include "xla_spawn/shm/layout.h"

namespace xs {
namespace {

// A value read from a running replica's record: seconds from `since_ns` to `now`, or -1 when
// it is 0 or not in the past (a torn or garbage record).
double seconds_since(int64_t since_ns, int64_t now) {
  if (since_ns <= 0 || since_ns > now) return -1;
  return static_cast<double>(now - since_ns) * 1e-9;
}

std::string state_name(char state) {
  switch (state) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "in uninterruptible sleep";
    case 'T': return "stopped";
    case 't': return "stopped by a tracer";
    case 'Z': return "exited";
    case '\0': return "gone";
    default: return fmt::format("state {}", state);
  }
}

OrdinalCall::Arrivals combined(const OrdinalCall& c) {
  return {c.steps.calls + c.other.calls, c.steps.waited + c.other.waited,
          c.steps.last + c.other.last, c.steps.late_us + c.other.late_us};
}

double mean_late_ms(const OrdinalCall::Arrivals& a) {
  return static_cast<double>(a.late_us) / 1e3 / static_cast<double>(a.last);
}

}  // namespace

std::vector<OrdinalCall> read_calls(const void* base, size_t mapped_bytes, int world_size,
                                    std::span<const pid_t> pids) {
  std::vector<OrdinalCall> calls;
  if (world_size <= 0 || world_size > shm::kMaxWorldSize ||
      shm::slots_offset() + sizeof(shm::OrdinalSlot) * static_cast<size_t>(world_size) >
          mapped_bytes) {
    return calls;
  }
  const auto* slots = reinterpret_cast<const shm::OrdinalSlot*>(
      static_cast<const std::byte*>(base) + shm::slots_offset());
  const int64_t now = record_time_ns(std::chrono::steady_clock::now());
  for (int k = 0; k < world_size; ++k) {
    const shm::CallRecord& r = slots[k].call;
    OrdinalCall c;
    c.ordinal = k;
    c.pid = static_cast<size_t>(k) < pids.size() ? pids[static_cast<size_t>(k)] : 0;
    c.slot_pid = slots[k].pid.load(std::memory_order_relaxed);
    // The process that checked in is the one making the calls (a wrapper's child, say), when
    // it is of this replica's tree (a scribbled pid is not looked at).
    if (c.slot_pid > 0 && (c.pid <= 0 || of_replica(c.slot_pid, c.pid))) c.pid = c.slot_pid;
    c.dumps_stack = r.dumps_stack.load(std::memory_order_relaxed) == 1;
    if (c.pid > 0) {
      const std::optional<std::string> fields = process_stat_fields(c.pid);
      c.state = fields && !fields->empty() ? (*fields)[0] : '\0';
    }
    c.seq = r.seq.load(std::memory_order_acquire);
    c.returned = r.returned.load(std::memory_order_acquire) == 1;
    c.between_nodes = r.between_nodes.load(std::memory_order_acquire) == 1;
    char name[sizeof r.name + 1] = {};
    std::memcpy(name, r.name, sizeof r.name);
    c.name.assign(name, strnlen(name, sizeof r.name));
    if (!std::all_of(c.name.begin(), c.name.end(), [](char ch) { return ch == '_' || (ch >= 'a' && ch <= 'z'); })) {
      c.name = "?";
    }
    const uint8_t dtype = r.dtype.load(std::memory_order_relaxed);
    if (dtype <= static_cast<uint8_t>(DType::kBool)) c.dtype = dtype_name(static_cast<DType>(dtype));
    c.n_elems = r.n_elems.load(std::memory_order_relaxed);
    c.graph_hash = r.graph_hash.load(std::memory_order_relaxed);
    c.seconds_in_call = seconds_since(r.started_ns.load(std::memory_order_relaxed), now);
    c.seconds_waiting = seconds_since(r.waiting_since_ns.load(std::memory_order_relaxed), now);
    const int32_t awaited = r.awaited.load(std::memory_order_relaxed);
    c.awaited = awaited >= 0 && awaited < world_size ? awaited : -1;
    const auto read = [](const shm::ArrivalGroup& g) {
      OrdinalCall::Arrivals a;
      a.calls = g.calls.load(std::memory_order_relaxed);
      a.waited = std::min(g.waited.load(std::memory_order_relaxed), a.calls);
      a.last = std::min(g.last.load(std::memory_order_relaxed), a.waited);
      a.late_us = a.last > 0 ? g.late_us.load(std::memory_order_relaxed) : 0;
      return a;
    };
    c.steps = read(slots[k].arrivals.steps);
    c.other = read(slots[k].arrivals.other);
    const uint64_t first_us = slots[k].arrivals.first_step_us.load(std::memory_order_relaxed);
    const uint64_t last_us = slots[k].arrivals.last_step_us.load(std::memory_order_relaxed);
    if (c.steps.calls >= 2 && last_us > first_us) {
      c.step_ms = static_cast<double>(last_us - first_us) / 1e3 / static_cast<double>(c.steps.calls - 1);
    }
    calls.push_back(std::move(c));
  }
  return calls;
}

std::string format_calls(const std::vector<OrdinalCall>& calls, int first_ordinal,
                         bool spans_nodes) {
  // Who holds the job up: an ordinal some wait is for that is behind the waiter (an earlier
  // call) or in the same call without waiting itself, and that is not sleeping in a wait of
  // its own (stopped, gone, computing, stuck elsewhere). A wait for an ordinal already past
  // the waiter's call is stale: the waiter was stopped or died before it saw the peer move.
  // So is any wait of a stopped waiter: stopped inside a wait, it never saw the peer it
  // waited for arrive (which then waits for it), and only its own stop holds it.
  const auto asleep_in_wait = [](const OrdinalCall& c) {
    return c.seconds_waiting >= 0 && (c.state == 'S' || c.state == 'R');
  };
  std::vector<bool> holds_up(calls.size(), false);
  for (const OrdinalCall& w : calls) {
    if (w.returned || w.seconds_waiting < 0 || w.awaited < 0 || w.state == 'T' ||
        w.state == 't' || static_cast<size_t>(w.awaited) >= calls.size()) {
      continue;
    }
    const OrdinalCall& x = calls[static_cast<size_t>(w.awaited)];
    if (x.seq < w.seq || (x.seq == w.seq && !asleep_in_wait(x))) {
      holds_up[static_cast<size_t>(w.awaited)] = !asleep_in_wait(x);
    }
  }
  std::string out;
  for (const OrdinalCall& c : calls) {
    out += fmt::format("  ordinal {} (pid {}, {}): ", first_ordinal + c.ordinal, c.pid,
                       state_name(c.state));
    if (c.seq == 0 && c.name.empty()) {
      out += "no collective call yet\n";
      continue;
    }
    // "(f32, 8 elements, graph ...)"; a call without operands (barrier, rendezvous) shows
    // only its graph, if any.
    std::vector<std::string> parts;
    if (!c.dtype.empty()) parts.push_back(c.dtype);
    if (!c.dtype.empty() || c.n_elems != 0) parts.push_back(fmt::format("{} elements", c.n_elems));
    if (c.graph_hash != 0) parts.push_back(fmt::format("graph {:016x}", c.graph_hash));
    const std::string operands =
        parts.empty() ? std::string() : fmt::format(" ({})", fmt::join(parts, ", "));
    // A node of one replica records its calls' transfers between nodes alone (no numbers).
    const std::string what = c.seq == 0 ? c.name + operands
                                        : fmt::format("{} #{}{}", c.name, c.seq, operands);
    if (c.between_nodes) {  // in gloo's transfers: the other nodes are late, or the network
      out += fmt::format("{}{} between nodes", c.name, operands);
      if (c.seconds_in_call >= 0) out += fmt::format(" for {:.1f} s", c.seconds_in_call);
      out += ", waiting for the other nodes";
    } else if (c.returned) {  // computing, loading data, stuck outside the collectives
      out += "between collective calls, the latest " + what;
      if (c.seconds_in_call >= 0) out += fmt::format(" began {:.1f} s ago", c.seconds_in_call);
    } else {
      out += what;
      if (c.seconds_in_call >= 0) out += fmt::format(" for {:.1f} s", c.seconds_in_call);
      if (c.seconds_waiting >= 0) {
        out += fmt::format(", waiting {:.1f} s for ", c.seconds_waiting);
        out += c.awaited >= 0 ? fmt::format("ordinal {}", first_ordinal + c.awaited)
                              : std::string("its peers");
      } else {
        out += ", not waiting";
      }
    }
    const OrdinalCall::Arrivals all = combined(c);
    if (calls.size() > 1 && all.calls > 0) {
      out += fmt::format("; {} calls, {} waited, last to arrive at {}", all.calls, all.waited,
                         all.last);
      if (all.last > 0) out += fmt::format(", {:.2f} ms late on average", mean_late_ms(all));
    }
    out += "\n";
  }
  std::string held;
  for (const OrdinalCall& c : calls) {
    if (!holds_up[static_cast<size_t>(c.ordinal)]) continue;
    held += fmt::format("{}{} ({})", held.empty() ? "" : ", ", first_ordinal + c.ordinal,
                        state_name(c.state));
  }
  if (!held.empty()) out += fmt::format("  held up by ordinal(s) {}\n", held);
  if (auto straggler = straggler_line(calls, first_ordinal, spans_nodes)) {
    out += "  " + *straggler + "\n";
  }
  return out;
}

double binomial_tail(uint64_t n, uint64_t k, double p) {
  if (k == 0) return 1;
  if (k > n) return 0;
  // Summed in log space from k up: each term is the previous one times (n-i)/(i+1) * p/(1-p).
  double log_term = std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(k) + 1) -
                    std::lgamma(static_cast<double>(n - k) + 1) + static_cast<double>(k) * std::log(p) +
                    static_cast<double>(n - k) * std::log1p(-p);
  double total = 0;
  for (uint64_t i = k; i <= n; ++i) {
    total += std::exp(log_term);
    log_term += std::log(static_cast<double>(n - i)) - std::log(static_cast<double>(i) + 1) +
                std::log(p) - std::log1p(-p);
  }
  return std::min(total, 1.0);
}

std::optional<std::string> straggler_line(const std::vector<OrdinalCall>& calls, int first_ordinal,
                                          bool spans_nodes) {
  if (calls.size() < 2) return std::nullopt;
  const bool by_steps = std::any_of(calls.begin(), calls.end(), [](const OrdinalCall& c) {
    return c.steps.waited >= kStragglerMinCalls;
  });
  const double chance = 1.0 / static_cast<double>(calls.size());
  for (const OrdinalCall& c : calls) {
    const OrdinalCall::Arrivals a = by_steps ? c.steps : combined(c);
    if (a.waited < kStragglerMinCalls || a.last == 0) continue;
    const double share = static_cast<double>(a.last) / static_cast<double>(a.waited);
    if (share <= (calls.size() == 2 ? 0.75 : 0.5)) continue;
    if (binomial_tail(a.waited, a.last, chance) >= kStragglerChance) continue;
    const double late_ms = mean_late_ms(a);
    if (by_steps && c.step_ms > 0 && late_ms < kStragglerMinShare * c.step_ms) continue;
    return fmt::format(
        "ordinal {} arrived last at {:.0f}% of the {} {} that waited (of {}), {:.2f} ms after the "
        "first on average{}: check what slows it (other work on its core, its core binding, its "
        "data loading, a larger shard{})",
        first_ordinal + c.ordinal, share * 100, a.waited,
        by_steps ? "training steps" : "collective calls", a.calls, late_ms,
        by_steps && c.step_ms > 0 ? fmt::format(", in steps of {:.2f} ms", c.step_ms) : "",
        spans_nodes ? ", its link to the other nodes" : "");
  }
  return std::nullopt;
}

}  // namespace xs
