# Sorting and percentiles for the scaling benchmark's awk programs (mawk has no asort).
#   n = 0; for (...) v[++n] = x; sort_numeric(v, n); med = percentile(v, n, 50)

# Sorts v[1..n] ascending in place (heapsort: O(n log n), no recursion).
function sort_numeric(v, n,    i, end, t) {
  for (i = int(n / 2); i >= 1; --i) sift_down(v, i, n)
  for (end = n; end > 1; --end) {
    t = v[1]; v[1] = v[end]; v[end] = t
    sift_down(v, 1, end - 1)
  }
}

function sift_down(v, i, n,    c, t) {
  while ((c = 2 * i) <= n) {
    if (c < n && v[c + 1] > v[c]) ++c
    if (v[i] >= v[c]) return
    t = v[i]; v[i] = v[c]; v[c] = t
    i = c
  }
}

# p-th percentile (0..100) of sorted v[1..n], linear interpolation between ranks; 0 if n = 0.
function percentile(v, n, p,    x, lo, f) {
  if (n == 0) return 0
  x = 1 + (n - 1) * p / 100
  lo = int(x)
  f = x - lo
  return lo >= n ? v[n] : v[lo] + f * (v[lo + 1] - v[lo])
}
