#pragma once
// Timing helpers shared by the runtime benchmarks: thread CPU time, medians, and two
// workloads timed alternately so machine load hits both alike.
//
//   const auto [t_runtime, t_blas] = xs::bench::interleaved(30, run_lazy, run_sgemm);

#include <time.h>

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

namespace xs::bench {

// This thread's CPU time in seconds: BLAS is pinned to one thread (the caller's), so CPU time
// is the work done, and time spent descheduled by other processes on a shared machine is not.
inline double now_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times a and b alternately `reps` times; returns their median seconds.
inline std::pair<double, double> interleaved(int reps, const std::function<void()>& a,
                                             const std::function<void()>& b) {
  std::vector<double> ta, tb;
  for (int i = 0; i < reps; ++i) {
    double t0 = now_s();
    a();
    ta.push_back(now_s() - t0);
    t0 = now_s();
    b();
    tb.push_back(now_s() - t0);
  }
  return {median(ta), median(tb)};
}

}  // namespace xs::bench
