# Per-configuration summary of scripts/bench-multihost --train: reads the runs CSV that
# bench/scaling/summarize_run.awk wrote, one row per training run, whose mode column names the
# configuration HOSTSxREPLICAS (e.g. 2x2); needs bench/scaling/stats.awk. Writes summary_out
# and prints a markdown table.
#
# samples/s: median over runs. per replica: that / replicas. vs 1x1: median over rounds of the
# per-replica samples/s over 1x1's in the same round (the configurations of a round ran one
# after the other, so load from other work hits them alike). Step times and the breakdown:
# median over runs of each run's mean over ordinals and steps (ms). The all-reduce splits into
# between hosts (internode_ms: gloo's sends, receives and waits, the remote peers' lateness
# included) and in the host (the rest: shared memory, waiting for local peers).
FNR == 1 { next }
{
  c = $1
  if (!(c in runs)) order[++n_configs] = c
  r = ++runs[c]
  replicas[c] = $2
  round[c, r] = $3
  sps[c, r] = $7; p50[c, r] = $8; mean[c, r] = $10; dw[c, r] = $11; tc[c, r] = $12
  cp[c, r] = $13; ar[c, r] = $14; coll[c, r] = $15; pw[c, r] = $16
  nw[c, r] = NF >= 22 ? $22 : 0
  by_round[c, $3] = $7 / $2
}

function med(a, c,    i, v) {
  for (i = 1; i <= runs[c]; ++i) v[i] = a[c, i]
  sort_numeric(v, runs[c])
  return percentile(v, runs[c], 50)
}

# Median over the rounds both ran of c's per-replica samples/s over 1x1's; 0 without 1x1.
function vs_single(c,    i, m, v, rd) {
  for (i = 1; i <= runs[c]; ++i) {
    rd = round[c, i]
    if (by_round["1x1", rd] > 0) v[++m] = by_round[c, rd] / by_round["1x1", rd]
  }
  if (m == 0) return 0
  sort_numeric(v, m)
  return percentile(v, m, 50)
}

END {
  print "config,hosts,replicas_per_host,replicas,runs,samples_per_s,per_replica_samples_per_s," \
        "per_replica_vs_1x1,step_median_ms,step_mean_ms,data_wait_ms,trace_compile_ms,compute_ms," \
        "allreduce_ms,in_host_allreduce_ms,between_hosts_ms,collective_ms,peer_wait_ms" > summary_out
  print "| hosts x replicas | samples/s | per replica | per replica vs 1x1 | step median | compute | trace + compile | data wait | all-reduce in host | all-reduce between hosts |"
  print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for (i = 1; i <= n_configs; ++i) {
    c = order[i]
    split(c, hl, "x")
    n = replicas[c]
    s = med(sps, c); a = med(ar, c); w = med(nw, c)
    in_host = a - w > 0 ? a - w : 0
    printf "%s,%d,%d,%d,%d,%.1f,%.1f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f\n",
      c, hl[1], hl[2], n, runs[c], s, s / n, vs_single(c), med(p50, c), med(mean, c), med(dw, c),
      med(tc, c), med(cp, c), a, in_host, w, med(coll, c), med(pw, c) > summary_out
    printf "| %s | %.0f | %.0f | %.2fx | %.1f ms | %.1f ms | %.1f ms | %.1f ms | %.1f ms | %.1f ms |\n",
      c, s, s / n, vs_single(c), med(p50, c), med(cp, c), med(tc, c), med(dw, c), in_host, w
  }
  printf "(medians over runs; step parts are means over ordinals in ms; the all-reduce includes\n"
  printf " waiting for the slowest replica)\n"
}
