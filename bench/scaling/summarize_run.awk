# One run's summary row from train_fmnist's --step-timing-csv (ordinal,epoch,step,step_ms,
# wait_ms,trace_ms,compile_ms,compute_ms,allreduce_ms,rendezvous_ms,end_ms,internode_ms; rows
# grouped by ordinal, in step order).
# Needs stats.awk. Variables: mode, n, round, batch (per replica), warmup (steps dropped),
# wall_s (trainer's training seconds, 0 if unknown), load, steps_out (per-step rows appended).
#
# Per step i (after warm-up) over ordinals k: the collective's own time is estimated as the
# all-reduce time of the LAST replica to arrive (min_k allreduce_ms: it waits for nobody), and
# each replica's wait for peers as allreduce_ms - that minimum; the last to arrive is the
# step's slowest ordinal (straggler). Times are means over ordinals, then over steps (ms).
# The runtime's graph-hash rendezvous (rendezvous_ms: only in steps whose graph changed, so
# normally in warm-up alone) is waiting for peers too and is added to peer_wait_ms. CSVs from
# before that column (9 columns) count it in trace_ms. internode_ms (last column of the row,
# mean over ordinals and steps) is the part of allreduce_ms spent in the network between nodes
# (0 on one node and in CSVs without the column).
BEGIN {
  if (header_only) {
    print "mode,n,round,batch_per_replica,global_batch,measured_steps,samples_per_s," \
          "step_median_ms,step_p90_ms,step_mean_ms,data_wait_ms,trace_compile_ms,compute_ms," \
          "allreduce_ms,collective_ms,peer_wait_ms,untimed_share,wall_share," \
          "slowest_ordinal,slowest_share,loadavg,internode_ms"
    exit
  }
}
FNR == 1 { next }
{
  k = $1 + 0
  i = cnt[k]++
  st[k, i] = $4; dw[k, i] = $5; tr[k, i] = $6 + $7; un[k, i] = $6; cp[k, i] = $8; ar[k, i] = $9
  rv[k, i] = NF >= 10 ? $10 : 0
  nw[k, i] = NF >= 12 ? $12 : 0
  if (k == 0) all_step_ms += $4
  if (k + 1 > nord) nord = k + 1
}
END {
  if (header_only) exit
  if (nord != n) { printf "summarize_run: CSV has %d ordinals, expected N = %d\n", nord, n > "/dev/stderr"; exit 1 }
  m = cnt[0]
  for (k = 1; k < n; ++k) if (cnt[k] < m) m = cnt[k]
  if (m <= warmup) { printf "summarize_run: %d steps <= warm-up %d\n", m, warmup > "/dev/stderr"; exit 1 }
  ms = 0
  for (i = warmup; i < m; ++i) {
    s = 0; lo = -1; slow = 0
    for (k = 0; k < n; ++k) {
      s += st[k, i]
      if (lo < 0 || ar[k, i] < lo) { lo = ar[k, i]; slow = k }
    }
    job = s / n
    vals[++ms] = job
    sum_step += job; sum_coll += lo
    slow_count[slow]++
    for (k = 0; k < n; ++k) {
      sum_dw += dw[k, i] / n; sum_tr += tr[k, i] / n; sum_cp += cp[k, i] / n
      sum_ar += ar[k, i] / n; sum_pw += (ar[k, i] - lo + rv[k, i]) / n; sum_un += un[k, i] / n
      sum_nw += nw[k, i] / n
    }
    printf "%d,%d,%d,%.4f,%d\n", n, round, i, job, slow >> steps_out
  }
  top = 0
  for (k = 1; k < n; ++k) if (slow_count[k] > slow_count[top]) top = k
  sort_numeric(vals, ms)
  mean = sum_step / ms
  # untimed_share: the part of the step no timer covers (the trainer's trace_ms is this
  # residual: tracing the graph in C++); wall_share: the steps' summed times over the
  # trainer's own training clock (1.0 = the per-step timings account for all the time).
  printf "%s,%d,%d,%d,%d,%d,%.1f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%d,%.3f,%s,%.4f\n",
    mode, n, round, batch, batch * n, ms, n * batch * ms / (sum_step / 1000),
    percentile(vals, ms, 50), percentile(vals, ms, 90), mean,
    sum_dw / ms, sum_tr / ms, sum_cp / ms, sum_ar / ms, sum_coll / ms, sum_pw / ms,
    (sum_un / ms) / mean, (wall_s > 0 ? all_step_ms / 1000 / wall_s : 0),
    top, slow_count[top] / ms, load, sum_nw / ms
}
