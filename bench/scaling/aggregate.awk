# Per-N summary of the scaling benchmark: reads runs-<mode>.csv (one row per run, from
# summarize_run.awk) then steps-<mode>.csv (one row per measured step); needs stats.awk.
# Prints the console table and writes summary_out. Variables: cores (CPUs of the machine).
#
# samples/s: median over runs (rounds were interleaved across N); speed-up against N = 1's
# median; efficiency = speed-up / N; core efficiency = speed-up / min(N, cores) (N > cores
# replicas share the cores: that is the most they can gain). Step median/p90 pool every
# measured step of every run. Breakdown columns: median over runs of each run's mean (ms).
# speedup_paired: median over rounds of (this N's samples/s / N = 1's in the same round), the
# steadier figure when load from other work drifts between rounds.
FNR == 1 { file++; next }
file == 1 {
  n = $2 + 0
  if (!(n in runs)) order[++n_sizes] = n
  r = ++runs[n]
  mode = $1
  sps[n, r] = $7; stepmean[n, r] = $10; dw[n, r] = $11; tc[n, r] = $12; cp[n, r] = $13
  coll[n, r] = $15; pw[n, r] = $16; untimed[n, r] = $17; wall[n, r] = $18
  next
}
file == 2 { n = $1 + 0; steps[n, ++n_steps[n]] = $4; slow[n, $5]++ }

# Median over rounds of a[n, r] / a[1, r] (rounds both ran), 0 without N = 1.
function paired(a, n,    r, m, v) {
  for (r = 1; r <= runs[n] && r <= runs[1]; ++r) if (a[1, r] > 0) v[++m] = a[n, r] / a[1, r]
  if (m == 0) return 0
  sort_numeric(v, m)
  return percentile(v, m, 50)
}

# Median of field array a[n, 1..runs[n]].
function med(a, n,    i, v) {
  for (i = 1; i <= runs[n]; ++i) v[i] = a[n, i]
  sort_numeric(v, runs[n])
  return percentile(v, runs[n], 50)
}

END {
  for (i = 1; i <= n_sizes; ++i) for (j = i + 1; j <= n_sizes; ++j)
    if (order[j] < order[i]) { t = order[i]; order[i] = order[j]; order[j] = t }
  base = (1 in runs) ? med(sps, 1) : 0
  print "mode,n,runs,samples_per_s,samples_per_s_min,samples_per_s_max,speedup,efficiency," \
        "core_efficiency,step_median_ms,step_p90_ms,step_mean_ms,data_wait_ms,trace_compile_ms," \
        "compute_ms,collective_ms,peer_wait_ms,allreduce_share,breakdown_sum_share," \
        "untimed_share,wall_share,slowest_ordinal,slowest_share,speedup_paired" > summary_out
  printf "%3s %4s %10s %7s %7s %6s %6s %8s %8s | %7s %7s %7s %7s %7s %6s %6s %6s %6s | %s\n",
    "N", "runs", "samples/s", "speedup", "paired", "eff", "core", "step p50", "p90", "data", "trace",
    "compute", "coll", "peer", "AR%", "sum%", "untim%", "wall%", "slowest ordinal"
  for (i = 1; i <= n_sizes; ++i) {
    n = order[i]
    v_sps = med(sps, n); lo = hi = sps[n, 1]
    for (r = 1; r <= runs[n]; ++r) { if (sps[n, r] < lo) lo = sps[n, r]; if (sps[n, r] > hi) hi = sps[n, r] }
    m = n_steps[n]
    for (s = 1; s <= m; ++s) v[s] = steps[n, s]
    sort_numeric(v, m)
    p50 = percentile(v, m, 50); p90 = percentile(v, m, 90)
    sm = med(stepmean, n); d = med(dw, n); t = med(tc, n); c = med(cp, n)
    co = med(coll, n); p = med(pw, n)
    speed = base > 0 ? v_sps / base : 0
    top = 0
    for (k = 1; k < n; ++k) if (slow[n, k] > slow[n, top]) top = k
    printf "%s,%d,%d,%.1f,%.1f,%.1f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%d,%.4f,%.4f\n",
      mode, n, runs[n], v_sps, lo, hi, speed, speed / n, speed / (n < cores ? n : cores),
      p50, p90, sm, d, t, c, co, p, (co + p) / sm, (d + t + c + co + p) / sm,
      med(untimed, n), med(wall, n), top, slow[n, top] / m, paired(sps, n) > summary_out
    printf "%3d %4d %10.0f %6.2fx %6.2fx %5.0f%% %5.0f%% %6.2fms %6.2fms | %7.2f %7.2f %7.2f %7.2f %7.2f %5.1f%% %5.1f%% %5.1f%% %5.1f%% | %d (%.0f%% of steps)\n",
      n, runs[n], v_sps, speed, paired(sps, n), 100 * speed / n, 100 * speed / (n < cores ? n : cores), p50, p90,
      d, t, c, co, p, 100 * (co + p) / sm, 100 * (d + t + c + co + p) / sm,
      100 * med(untimed, n), 100 * med(wall, n), top, 100 * slow[n, top] / m
  }
  print "(ms per step, mean over ordinals, median over runs: data = waiting for (or, without a loader"
  print " thread, building) the batch; trace = tracing and compiling; compute = the compiled program minus"
  print " its all-reduce; coll = the all-reduce of the last replica to arrive; peer = the rest of the"
  print " all-reduce time (waiting for peers) plus the runtime's graph-hash rendezvous, which runs only in"
  print " steps whose graph changed. AR% = (coll+peer)/step; sum% = the five over the mean step; untim% ="
  print " the step part no timer covers (trace without compile); wall% = summed step times over the"
  print " trainer's own training clock;"
  print " core = speed-up / min(N, CPUs); speedup = ratio of medians, paired = median of same-round ratios.)"
}
