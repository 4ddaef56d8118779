// The multi-node sweep (multi_node_bench.h's method) with Open MPI's MPI_Allreduce, for a
// third column beside the hierarchical all-reduce and the flat gloo ring. Ranks on one host
// reach each other through Open MPI's shared memory (vader), hosts through its TCP BTL.
//
//   mpirun --allow-run-as-root --hostfile HOSTS -np 4 --bind-to core
//       mpi_multi_node_sweep [--min-bytes 8] [--max-bytes 67108864] [--reps 20] [--csv F]
//
// scripts/bench-multihost --mpi starts it in namespace hosts (plm_rsh_agent). Local rank 0 of
// each host (OMPI_COMM_WORLD_LOCAL_RANK) reads that host's eth0 counters; the host count is
// the number of distinct MPI processor names.
#include <mpi.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "bench/cluster/multi_node_bench.h"

namespace {

// Distinct processor names (hosts) across the job, and the number of ranks on this one.
void count_hosts(int world_size, int& nnodes, int& local_world_size) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  std::vector<char> all(static_cast<size_t>(world_size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, MPI_COMM_WORLD);
  std::set<std::string> hosts;
  local_world_size = 0;
  for (int k = 0; k < world_size; ++k) {
    const std::string theirs(all.data() + static_cast<size_t>(k) * MPI_MAX_PROCESSOR_NAME);
    hosts.insert(theirs);
    local_world_size += theirs == name;
  }
  nnodes = static_cast<int>(hosts.size());
}

xs::bench::JobHooks job_hooks() {
  xs::bench::JobHooks job;
  MPI_Comm_rank(MPI_COMM_WORLD, &job.ordinal);
  MPI_Comm_size(MPI_COMM_WORLD, &job.world_size);
  count_hosts(job.world_size, job.nnodes, job.local_world_size);
  job.reads_link = xs::env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, 1 << 20).value_or(0) == 0;
  job.barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };
  job.all_gather = [](const double* in, double* out, size_t n) {
    MPI_Allgather(in, static_cast<int>(n), MPI_DOUBLE, out, static_cast<int>(n), MPI_DOUBLE,
                  MPI_COMM_WORLD);
  };
  job.sum = [](int64_t value) {
    MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    return value;
  };
  return job;
}

int run(const xs::bench::MultiNodeArgs& args) {
  const xs::bench::JobHooks job = job_hooks();
  std::vector<float> heap(args.sizes.max_bytes / sizeof(float) + 1, 0.0f);
  const std::vector<xs::bench::Contender> contenders = {
      {"mpi", heap.data(), [](float* d, size_t n) {
         MPI_Allreduce(MPI_IN_PLACE, d, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
       }}};
  const auto rows = xs::bench::run_multi_node_sweep(args, job, contenders);
  return xs::bench::report_multi_node_sweep(rows, job, args, "mpi_multi_node_sweep");
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 2;
  try {
    code = run(xs::bench::parse_multi_node_args(argc, argv, {"mpi"}));
  } catch (const std::exception& e) {
    fmt::print(stderr, "mpi_multi_node_sweep: {}\n", e.what());
  }
  if (code == 2) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
  return code;
}
