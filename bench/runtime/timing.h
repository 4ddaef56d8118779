#pragma once
// Timing helpers shared by the runtime benchmarks: thread CPU time, medians, and workloads
// timed in turn so machine load hits them alike.
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

// Times each of `fns` in turn, round after round, `reps` rounds; returns their median seconds.
inline std::vector<double> interleaved(int reps, const std::vector<std::function<void()>>& fns) {
  std::vector<std::vector<double>> t(fns.size());
  for (int i = 0; i < reps; ++i)
    for (size_t f = 0; f < fns.size(); ++f) {
      const double t0 = now_s();
      fns[f]();
      t[f].push_back(now_s() - t0);
    }
  std::vector<double> medians;
  for (auto& v : t) medians.push_back(median(std::move(v)));
  return medians;
}

// Times a and b alternately `reps` times; returns their median seconds.
inline std::pair<double, double> interleaved(int reps, const std::function<void()>& a,
                                             const std::function<void()>& b) {
  const std::vector<double> m = interleaved(reps, {a, b});
  return {m[0], m[1]};
}

}  // namespace xs::bench
