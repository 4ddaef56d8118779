// The same all-reduce sweep with Open MPI's MPI_Allreduce, for comparison.
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 mpi_all_reduce_sweep [--csv out/mpi-2.csv]
#include <mpi.h>

#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "bench/collectives/sweep.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int code = 0;
  try {
    xs::bench::SweepOptions options;
    const auto rest = xs::bench::parse_sweep_args(argc, argv, options);
    std::string csv;
    for (size_t i = 0; i + 1 < rest.size(); ++i) {
      if (rest[i] == "--csv") csv = rest[i + 1];
    }
    xs::bench::SweepHooks hooks;
    hooks.ordinal = rank;
    hooks.world_size = size;
    hooks.all_reduce = [](float* d, size_t n) {
      MPI_Allreduce(MPI_IN_PLACE, d, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    hooks.barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };
    hooks.broadcast_from_0 = [](int64_t v) {
      MPI_Bcast(&v, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
      return v;
    };
    hooks.algorithm = [](size_t) { return std::string("mpi"); };
    const auto rows = xs::bench::run_sweep(options, hooks);
    if (rank == 0) {
      xs::bench::print_table(stdout, rows, size, "Open MPI MPI_Allreduce");
      if (!csv.empty()) xs::bench::write_csv(csv, rows, size);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "rank {}: {}\n", rank, e.what());
    code = 1;
  }
  MPI_Finalize();
  return code;
}
