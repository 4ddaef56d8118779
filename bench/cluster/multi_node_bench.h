#pragma once
// The multi-node all-reduce sweep's method, shared by the xla-spawn program (hierarchical vs
// flat gloo, multi_node_sweep.cpp) and the Open MPI one (mpi_multi_node_sweep.cpp), so their
// figures compare: per size and contender, one verification run (inputs from (ordinal, index)
// whose sums are exact in any order), then `reps` timed iterations of an operand of zeros,
// each after a job-wide barrier; sizes alternate which contender goes first.
//
//   xs::bench::MultiNodeArgs args = xs::bench::parse_multi_node_args(argc, argv, {"mpi"});
//   auto rows = xs::bench::run_multi_node_sweep(args, job, contenders);  // collective
//   if (job.ordinal == 0) xs::bench::write_multi_node_csv(args.csv, rows, job, args.reps);
//
// Per iteration: the slowest replica's time, and the CPU time of every replica's process (all
// threads, user + system: most of the kernel's TCP work is charged to it) summed; a row has
// the medians over iterations. Wire bytes: the job's local-ordinal-0 replicas read their
// network namespace's eth0 counters (link_bytes.h) before the timed loop and after it and a
// closing barrier (so every peer has received it all), divided by reps: a row has the largest
// node's figure (empty without eth0). They include one barrier per iteration.
// algbw = size / time, busbw = algbw * 2(n-1)/n with n the job's world size (nccl-tests).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench/collectives/sweep.h"

namespace xs::bench {

struct MultiNodeArgs {
  SweepOptions sizes{.max_bytes = size_t{64} << 20};
  int reps = 20;
  std::string csv;
  std::vector<std::string> contenders;  // by name, in the order given
  bool quick = false;
};

// --min-bytes --max-bytes --factor --reps --csv, --impl NAME[,NAME] (one of `known`, or
// "both" for all of them), --quick: 8 B, 512 B and 32 KiB, 4 reps, only the first of `known`
// unless --impl says otherwise. Throws xs::InvalidArgument naming what was expected.
MultiNodeArgs parse_multi_node_args(int argc, char** argv, const std::vector<std::string>& known);

// The job as the sweep needs it; every call is collective.
struct JobHooks {
  int ordinal = 0;
  int world_size = 1;
  int nnodes = 1;
  int local_world_size = 1;
  bool reads_link = false;  // local ordinal 0: reads its node's eth0 counters
  std::function<void()> barrier;
  // Every replica's n doubles, by ordinal, into out (world_size * n).
  std::function<void(const double* in, double* out, size_t n)> all_gather;
  std::function<int64_t(int64_t)> sum;
};

// One implementation: its operand (room for the largest size) and its f32 sum in place.
struct Contender {
  std::string name;
  float* data = nullptr;
  std::function<void(float*, size_t)> all_reduce;
};

struct MultiNodeRow {
  size_t bytes = 0;
  size_t contender = 0;  // index into the contenders
  std::string name;
  double time_us = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  double cpu_us = 0;
  std::optional<double> tx_per_op;
  std::optional<double> rx_per_op;
  int64_t wrong = 0;  // summed over the job
};

// Every replica calls it with the same arguments; rows (sorted by size, then contender) on
// every ordinal.
std::vector<MultiNodeRow> run_multi_node_sweep(const MultiNodeArgs& args, const JobHooks& job,
                                               const std::vector<Contender>& contenders);

void print_multi_node_table(const std::vector<MultiNodeRow>& rows, const JobHooks& job, int reps);
// Columns: world_size,nnodes,size_bytes,n_elems,implementation,time_us,algbw_gbps,busbw_gbps,
// tx_bytes_per_op,rx_bytes_per_op,payload_ratio,wrong,reps,cpu_us.
void write_multi_node_csv(const std::string& path, const std::vector<MultiNodeRow>& rows,
                          const JobHooks& job, int reps);

// A sweep program's ending: ordinal 0 prints the table, writes args.csv (when given) and
// names the wrong elements in all (`program` in the message); the exit code, 0 when none.
int report_multi_node_sweep(const std::vector<MultiNodeRow>& rows, const JobHooks& job,
                            const MultiNodeArgs& args, const char* program);

}  // namespace xs::bench
