#include "xla_spawn/runtime/metrics.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace xs {
namespace {

std::string format_ns(double ns) {
  if (ns >= 1e9) return fmt::format("{:.3f}s", ns / 1e9);
  if (ns >= 1e6) return fmt::format("{:.3f}ms", ns / 1e6);
  if (ns >= 1e3) return fmt::format("{:.3f}us", ns / 1e3);
  return fmt::format("{:.0f}ns", ns);
}

}  // namespace

double TimerStats::percentile_ns(double p) const {
  if (samples_ns.empty()) return 0;
  std::vector<double> sorted = samples_ns;
  std::sort(sorted.begin(), sorted.end());
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  return sorted[static_cast<size_t>(std::lround(rank))];
}

void Metrics::increment(std::string_view counter, int64_t by) {
  auto it = counters_.find(counter);
  if (it == counters_.end()) it = counters_.emplace(std::string(counter), 0).first;
  it->second += by;
}

int64_t Metrics::counter(std::string_view counter) const {
  auto it = counters_.find(counter);
  return it == counters_.end() ? 0 : it->second;
}

void Metrics::record_ns(std::string_view timer, double ns) {
  auto it = timers_.find(timer);
  if (it == timers_.end()) it = timers_.emplace(std::string(timer), TimerStats{}).first;
  TimerStats& t = it->second;
  ++t.count;
  t.total_ns += ns;
  if (t.samples_ns.size() < kMaxSamples) {
    t.samples_ns.push_back(ns);
  } else {
    t.samples_ns[t.oldest] = ns;
    t.oldest = (t.oldest + 1) % kMaxSamples;
  }
}

double Metrics::total_ns(std::string_view timer) const {
  auto it = timers_.find(timer);
  return it == timers_.end() ? 0 : it->second.total_ns;
}

TimerStats Metrics::timer(std::string_view timer) const {
  auto it = timers_.find(timer);
  return it == timers_.end() ? TimerStats{} : it->second;
}

std::string Metrics::report() const {
  std::string out;
  for (const auto& [name, t] : timers_) {
    out += fmt::format("Metric: {}\n  TotalSamples: {}\n  Accumulator: {}\n", name, t.count,
                       format_ns(t.total_ns));
    out += "  Percentiles: ";
    const double ps[] = {1, 5, 10, 20, 50, 80, 90, 95, 99};
    for (size_t i = 0; i < std::size(ps); ++i) {
      out += fmt::format("{}{}%={}", i ? "; " : "", ps[i], format_ns(t.percentile_ns(ps[i])));
    }
    out += "\n";
  }
  for (const auto& [name, value] : counters_) {
    out += fmt::format("Counter: {}\n  Value: {}\n", name, value);
  }
  return out;
}

void Metrics::reset() {
  counters_.clear();
  timers_.clear();
}

}  // namespace xs
