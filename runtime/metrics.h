#pragma once
// Counters and timers in the PyTorch/XLA metrics layout, kept per runtime so tests can assert
// on them (and a fresh runtime starts from zero).
//
//   metrics.increment(kCounterCachedCompile);
//   { ScopedTimer t(metrics, kTimerExecuteTime); program.run(...); }
//   std::cout << metrics.report();   // "Metric: ExecuteTime\n  TotalSamples: 10 ..."

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace xs {

// Counters.
inline constexpr std::string_view kCounterCachedCompile = "CachedCompile";
inline constexpr std::string_view kCounterUncachedCompile = "UncachedCompile";
inline constexpr std::string_view kCounterMarkStep = "MarkStep";
inline constexpr std::string_view kCounterTransferToDevice = "TransferToDevice";
inline constexpr std::string_view kCounterTransferFromDevice = "TransferFromDevice";
// A host read that had to run pending IR outside mark_step (PyTorch/XLA counts these as
// aten::_local_scalar_dense and friends: ops run outside the step's compiled graph).
inline constexpr std::string_view kCounterOpsOutsideGraph = "OpsOutsideGraph";
inline constexpr std::string_view kCounterCreateCompileHandles = "CreateCompileHandles";
// Cross-replica graph-hash rendezvous run by mark_step (only when the graph changed).
inline constexpr std::string_view kCounterGraphHashCheck = "GraphHashCheck";
// Programs whose loops LLVM compiled to native code, and programs whose native code came from
// the persistent compile cache (XLA_SPAWN_COMPILE_CACHE_DIR) instead.
inline constexpr std::string_view kCounterNativeCompile = "NativeCompile";
inline constexpr std::string_view kCounterPersistentCacheHit = "PersistentCacheHit";
// Timers (nanoseconds).
inline constexpr std::string_view kTimerCompileTime = "CompileTime";
// CompileTime's two parts: the graph passes, lowering and view aliasing; native code.
inline constexpr std::string_view kTimerCompilePassesTime = "CompilePassesTime";
inline constexpr std::string_view kTimerCodegenTime = "CodegenTime";
// Starting LLVM's JIT, once per process, before its first compile (not part of CompileTime).
inline constexpr std::string_view kTimerCodegenStartTime = "CodegenStartTime";
inline constexpr std::string_view kTimerExecuteTime = "ExecuteTime";
inline constexpr std::string_view kTimerTransferFromDevice = "TransferFromDevice";
inline constexpr std::string_view kTimerAllReduceTime = "AllReduceTime";
// The graph-hash rendezvous (its waiting for peers included).
inline constexpr std::string_view kTimerGraphHashCheckTime = "GraphHashCheckTime";

struct TimerStats {
  int64_t count = 0;
  double total_ns = 0;
  // Percentile (0..100) of the recorded samples, in nanoseconds; 0 without samples.
  double percentile_ns(double p) const;
  std::vector<double> samples_ns;  // most recent kMaxSamples, a ring once full
  size_t oldest = 0;               // the ring's next slot to overwrite
};

class Metrics {
 public:
  static constexpr size_t kMaxSamples = 1024;  // as PyTorch/XLA keeps a bounded window

  void increment(std::string_view counter, int64_t by = 1);
  int64_t counter(std::string_view counter) const;  // 0 when never incremented
  void record_ns(std::string_view timer, double ns);
  TimerStats timer(std::string_view timer) const;  // a copy, samples included
  double total_ns(std::string_view timer) const;    // 0 when never recorded; no copy
  std::string report() const;
  void reset();

 private:
  std::map<std::string, int64_t, std::less<>> counters_;
  std::map<std::string, TimerStats, std::less<>> timers_;
};

class ScopedTimer {
 public:
  ScopedTimer(Metrics& metrics, std::string_view timer)
      : metrics_(metrics), timer_(timer), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    metrics_.record_ns(timer_, std::chrono::duration<double, std::nano>(
                                   std::chrono::steady_clock::now() - start_).count());
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  Metrics& metrics_;
  std::string_view timer_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace xs
