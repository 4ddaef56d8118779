# Combines the CSVs of repeated multi-node sweeps on one cluster (multi_node_sweep's, and
# mpi_multi_node_sweep's when given): run with -F, over the CSVs, runs in order. The k-th file
# that holds an implementation is that implementation's run k. Per size and implementation:
# the median over runs of each run's median time, wire bytes and CPU time.
#
# Prints markdown: hierarchical vs flat gloo (busbw ratio: the median over runs of each run's
# hierarchical / flat busbw, so load that drifts between runs cancels), then Open MPI if
# present (ratio against the hierarchical run of the same index). "each run": every run's own
# hierarchical / flat busbw. When csv_out is set, writes
# the medians in the sweeps' columns (what scripts/plot-bench reads). Variable cores (this
# machine's CPUs): "CPU busy" is the replicas' CPU time per all-reduce / (cores x time).
FNR == 1 { next }
{
  size = $3 + 0; impl = $5
  if (!(size in seen)) { seen[size] = 1; sizes[++n_sizes] = size }
  if (!(impl in runs) || file_of[impl] != FILENAME) { runs[impl]++; file_of[impl] = FILENAME }
  r = runs[impl]
  world = $1; nnodes = $2; n_elems[size] = $4; reps[impl] = $13
  time[size, impl, r] = $6
  tx[size, impl, r] = $9; rx[size, impl, r] = $10; cpu[size, impl, r] = $14
  wrong[size, impl] += $12
}

function median(v, m,    i, j, t) {
  for (i = 2; i <= m; ++i) for (j = i; j > 1 && v[j - 1] > v[j]; --j) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
  return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
}

# Median over runs of a[size, impl, run]; "" when no run has a value (no eth0, no such impl).
function over_runs(a, size, impl,    k, m, v) {
  for (k = 1; k <= runs[impl]; ++k) if (a[size, impl, k] != "") v[++m] = a[size, impl, k]
  return m ? median(v, m) : ""
}

# Run k's busbw of a / busbw of b, from the times (the CSV's busbw is rounded), "" if missing.
function ratio_of(size, a, b, k) {
  return (time[size, a, k] > 0 && time[size, b, k] > 0) ? time[size, b, k] / time[size, a, k] : ""
}

# Median over runs of ratio_of.
function paired_ratio(size, a, b,    k, m, v, x) {
  for (k = 1; k <= runs[a] && k <= runs[b]; ++k) if ((x = ratio_of(size, a, b, k)) != "") v[++m] = x
  return m ? sprintf("%.2fx", median(v, m)) : "-"
}

# Each run's ratio_of, comma-separated.
function each_ratio(size, a, b,    k, out, x) {
  for (k = 1; k <= runs[a] && k <= runs[b]; ++k)
    if ((x = ratio_of(size, a, b, k)) != "") out = out (out == "" ? "" : ", ") sprintf("%.2f", x)
  return out == "" ? "-" : out
}

function human(b) {
  if (b >= 1048576) return sprintf("%g MiB", b / 1048576)
  if (b >= 1024) return sprintf("%g KiB", b / 1024)
  return b " B"
}

function per_payload(t, size) { return t == "" ? "-" : sprintf("%.2f", t / size) }
function busy(c, t) { return (c == "" || t == "" || cores == "") ? "-" : sprintf("%.2f", c / (cores * t)) }

# Fills T[impl], B[impl] (busbw from the median time), X[impl], C[impl] for one size; writes
# the CSV rows.
function medians(s,    k, impl, algbw) {
  for (k = 1; k <= 3; ++k) {
    impl = k == 1 ? "hierarchical" : k == 2 ? "flat_gloo" : "mpi"
    T[impl] = over_runs(time, s, impl); X[impl] = over_runs(tx, s, impl); C[impl] = over_runs(cpu, s, impl)
    if (T[impl] == "") continue
    algbw = s / T[impl] * 1e-3; B[impl] = algbw * 2 * (world - 1) / world
    if (csv_out == "") continue
    printf "%s,%s,%d,%d,%s,%.2f,%.5f,%.5f,%s,%s,%s,%d,%d,%.1f\n", world, nnodes, s, n_elems[s], impl,
           T[impl], algbw, B[impl], X[impl], over_runs(rx, s, impl),
           (X[impl] == "" ? "" : sprintf("%.4f", X[impl] / s)), wrong[s, impl], reps[impl], C[impl] >csv_out
  }
}

END {
  if (csv_out != "") {
    print "world_size,nnodes,size_bytes,n_elems,implementation,time_us,algbw_gbps,busbw_gbps," \
          "tx_bytes_per_op,rx_bytes_per_op,payload_ratio,wrong,reps,cpu_us" >csv_out
  }
  printf "| size | hier time (us) | hier busbw (GB/s) | flat time (us) | flat busbw (GB/s) | busbw hier/flat | each run | wire/payload hier | wire/payload flat | CPU busy hier | CPU busy flat |\n"
  printf "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
  for (i = 1; i <= n_sizes; ++i) {
    s = sizes[i]
    medians(s)
    row[s] = sprintf("| %s | %.1f | %.4f | %.1f | %.4f | %s | %s | %s | %s | %s | %s |", human(s),
                     T["hierarchical"], B["hierarchical"], T["flat_gloo"], B["flat_gloo"],
                     paired_ratio(s, "hierarchical", "flat_gloo"),
                     each_ratio(s, "hierarchical", "flat_gloo"), per_payload(X["hierarchical"], s),
                     per_payload(X["flat_gloo"], s), busy(C["hierarchical"], T["hierarchical"]),
                     busy(C["flat_gloo"], T["flat_gloo"]))
    print row[s]
    if (T["mpi"] != "") {
      mpi_row[s] = sprintf("| %s | %.1f | %.4f | %s | %s | %s |", human(s), T["mpi"], B["mpi"],
                           paired_ratio(s, "hierarchical", "mpi"), per_payload(X["mpi"], s),
                           busy(C["mpi"], T["mpi"]))
    }
  }
  if (runs["mpi"] > 0) {
    printf "\nOpen MPI MPI_Allreduce (its own job, same method; ratio: hierarchical / MPI busbw)\n\n"
    printf "| size | mpi time (us) | mpi busbw (GB/s) | busbw hier/mpi | wire/payload mpi | CPU busy mpi |\n"
    printf "|---:|---:|---:|---:|---:|---:|\n"
    for (i = 1; i <= n_sizes; ++i) if (sizes[i] in mpi_row) print mpi_row[sizes[i]]
  }
  for (key in wrong) if (wrong[key] > 0) { print "summarize: wrong elements in a run" >"/dev/stderr"; exit 1 }
}
