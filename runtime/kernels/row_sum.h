#pragma once
// A sum in a fixed order that vectorises: term(j) for j in [0, n) goes to running sum
// j % kSumLanes, and the running sums are added in lane order at the end. The order depends
// only on n, so a row's sum does not depend on how rows are split and replicas agree bit for
// bit. Sixteen lanes are two vectors of doubles; an index-order sum waits on one add's latency
// per element (layer norm's statistics were 9% of a GPT step that way).
//
//   const double total = row_sum(n, [&](int64_t j) { return static_cast<double>(x[j]); });
#include <cstdint>

namespace xs::detail {

constexpr int64_t kSumLanes = 16;

template <typename Acc = double, typename Term>
Acc row_sum(int64_t n, const Term& term) {
  Acc lane[kSumLanes] = {};
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes)
    for (int64_t l = 0; l < kSumLanes; ++l) lane[l] += term(j + l);
  for (int64_t l = 0; j < n; ++j, ++l) lane[l] += term(j);
  Acc total = 0;
  for (Acc v : lane) total += v;
  return total;
}

// The largest of x[0, n), n >= 1, by the same lanes (max is exact, so only speed differs from
// an index-order scan; a NaN may or may not be returned, which softmax turns into NaN anyway).
template <typename T>
T row_max(const T* x, int64_t n) {
  T lane[kSumLanes];
  for (int64_t l = 0; l < kSumLanes; ++l) lane[l] = x[0];
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes)
    for (int64_t l = 0; l < kSumLanes; ++l) lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
  T top = x[0];
  for (; j < n; ++j) top = x[j] > top ? x[j] : top;
  for (T v : lane) top = v > top ? v : top;
  return top;
}

}  // namespace xs::detail
