// All-reduce sweep of xla-spawn's shared-memory collectives: forks N replicas over one job
// segment (no launcher needed), prints the nccl-tests style table and writes CSV.
//
//   all_reduce_sweep --nprocs 2 [--csv out/ours-2.csv] [--staging-bytes 2097152]
//                    [--min-bytes 8] [--max-bytes 268435456] [--factor 4]
//   all_reduce_sweep --nprocs 8 --stress 100000      # back-to-back 8-byte all-reduces
//   all_reduce_sweep --nprocs 8 --stress 200 --bytes 2097152   # same, f32 sum of zeros
//
// The operand comes from Communicator::alloc_buffer (the segment's buffer arena, sized to
// the largest message), so all_reduce reduces in place where it can (kDirect), as
// nccl-tests time registered buffers; --heap-buffers times ordinary heap memory instead
// (the staging / CMA schedules), and --heap-buffers --register heap memory registered once
// with Communicator::register_buffer (zero-copy again).
//
// Like mpirun, replicas are bound one per core when they fit (N <= cores; --no-bind turns
// it off): two spinning replicas that the scheduler puts on one core would only slow down.
//
// XLA_SPAWN_ALLREDUCE_ALGO=ring|oneshot|twoshot forces one schedule (for crossovers).
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "bench/collectives/sweep.h"
#include "xla_spawn/collectives/shm_communicator.h"
#include "xla_spawn/shm/segment.h"

namespace {

using xs::ShmCommunicator;

struct Args {
  int nprocs = 2;
  size_t staging_bytes = xs::kDefaultStagingBytes;
  std::string csv;
  int64_t stress_iterations = 0;
  size_t stress_bytes = 8;
  bool bind = true;
  bool heap_buffers = false;
  bool register_heap = false;
  xs::bench::SweepOptions sweep;
};

Args parse(int argc, char** argv) {
  Args args;
  const auto rest = xs::bench::parse_sweep_args(argc, argv, args.sweep);
  for (size_t i = 0; i < rest.size(); ++i) {
    auto value = [&]() {
      if (i + 1 >= rest.size()) throw std::invalid_argument(rest[i] + ": missing value");
      return rest[++i];
    };
    if (rest[i] == "--nprocs")
      args.nprocs = std::stoi(value());
    else if (rest[i] == "--staging-bytes")
      args.staging_bytes = std::stoull(value());
    else if (rest[i] == "--csv")
      args.csv = value();
    else if (rest[i] == "--stress")
      args.stress_iterations = std::stoll(value());
    else if (rest[i] == "--no-bind")
      args.bind = false;
    else if (rest[i] == "--heap-buffers")
      args.heap_buffers = true;
    else if (rest[i] == "--register")
      args.register_heap = true;
    else if (rest[i] == "--bytes")
      args.stress_bytes = std::stoull(value());
    else
      throw std::invalid_argument("unknown argument " + rest[i]);
  }
  return args;
}

// 8 bytes: an f64 sum checked every time. Larger: an f32 sum of zeros (in the buffer arena
// unless heap_buffers), checked at the end (the buffer is not refilled, so the loop times
// the all-reduce alone).
int stress(ShmCommunicator& comm, int64_t iterations, size_t bytes, bool heap_buffers) {
  const auto start = std::chrono::steady_clock::now();
  const double want = comm.world_size() * (comm.world_size() + 1) / 2.0;
  const size_t n = bytes / sizeof(float);
  std::vector<float> heap(heap_buffers ? n : 0, 0.0f);
  float* zeros = heap.data();
  if (!heap_buffers) {
    zeros = static_cast<float*>(comm.alloc_buffer(n * sizeof(float)));
    std::fill(zeros, zeros + n, 0.0f);
  }
  for (int64_t i = 0; i < iterations; ++i) {
    if (bytes == 8) {
      double value = comm.ordinal() + 1.0;
      comm.all_reduce(&value, 1, xs::DType::kF64, xs::ReduceOp::kSum);
      if (value != want) {
        fmt::print(stderr, "ordinal {} iteration {}: {} != {}\n", comm.ordinal(), i, value, want);
        return 1;
      }
    } else {
      comm.all_reduce(zeros, n, xs::DType::kF32, xs::ReduceOp::kSum);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (std::any_of(zeros, zeros + n, [](float v) { return v != 0.0f; })) {
    fmt::print(stderr, "ordinal {}: sum of zeros is not zero\n", comm.ordinal());
    return 1;
  }
  if (comm.ordinal() == 0) {
    fmt::print(
        "stress: {} back-to-back {}-byte all-reduces ({}) at N = {}: {:.3f} s, {:.2f} us each, "
        "all correct\n",
        iterations, bytes,
        xs::all_reduce_algorithm_name(comm.all_reduce_algorithm(bytes, !heap_buffers)),
        comm.world_size(), seconds, seconds / static_cast<double>(iterations) * 1e6);
  }
  return 0;
}

// Binds the calling replica to core `ordinal` when every replica gets a core of its own.
void bind_to_core(int ordinal, int world_size) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (world_size > cores) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(ordinal, &set);
  if (::sched_setaffinity(0, sizeof set, &set) != 0) {
    fmt::print(stderr, "ordinal {}: cannot bind to core {}: {}\n", ordinal, ordinal, errno);
  }
}

int replica(const Args& args, const std::string& segment, const std::string& job_id, int ordinal,
            const std::vector<double>& memcpy_gbps) {
  if (args.bind) bind_to_core(ordinal, args.nprocs);
  ShmCommunicator comm(xs::Segment::attach(segment, ordinal, args.nprocs, job_id));
  if (args.stress_iterations > 0) {
    return stress(comm, args.stress_iterations, args.stress_bytes, args.heap_buffers);
  }
  xs::bench::SweepHooks hooks;
  hooks.ordinal = ordinal;
  hooks.world_size = args.nprocs;
  hooks.all_reduce = [&](float* d, size_t n) {
    comm.all_reduce(d, n, xs::DType::kF32, xs::ReduceOp::kSum);
  };
  hooks.barrier = [&] { comm.barrier(); };
  hooks.broadcast_from_0 = [&](int64_t v) {
    comm.broadcast(&v, 1, xs::DType::kI64, 0);
    return v;
  };
  const bool zero_copy = !args.heap_buffers || args.register_heap;
  hooks.algorithm = [&](size_t bytes) {
    return std::string(xs::all_reduce_algorithm_name(comm.all_reduce_algorithm(bytes, zero_copy)));
  };
  if (!args.heap_buffers) {
    hooks.allocate = [&](size_t n) { return static_cast<float*>(comm.alloc_buffer(n * 4)); };
    hooks.release = [&](float* p) { comm.free_buffer(p); };
  } else if (args.register_heap) {
    hooks.allocate = [&](size_t n) {
      auto* p = new float[n]();
      if (!comm.register_buffer(p, n * sizeof(float))) {
        throw std::runtime_error(fmt::format("register_buffer refused {} bytes", n * sizeof(float)));
      }
      return p;
    };
    hooks.release = [&](float* p) {
      comm.deregister_buffer(p);
      delete[] p;
    };
  }
  auto rows = xs::bench::run_sweep(args.sweep, hooks);
  if (ordinal != 0) return 0;
  for (size_t i = 0; i < rows.size(); ++i) rows[i].memcpy_gbps = memcpy_gbps[i];
  xs::bench::print_table(stdout, rows, args.nprocs, "xla-spawn shared-memory all_reduce");
  if (!args.csv.empty()) xs::bench::write_csv(args.csv, rows, args.nprocs);
  return 0;
}

// Forks the replicas and waits for them; the first failure stops the others.
int run(const Args& args) {
  std::vector<double> memcpy_gbps;
  if (args.stress_iterations == 0) {
    memcpy_gbps = xs::bench::measure_memcpy(xs::bench::sweep_sizes(args.sweep), args.sweep);
  }
  const std::string job_id = fmt::format("bench-{}", ::getpid());
  // Arena: the largest operand (the sweep's, or the stress loop's) and the pages around it,
  // and at least a job's default, so that the arenas lie as far apart as xla-spawn's do.
  const size_t arena_bytes = std::max(
      xs::kDefaultArenaBytes,
      (args.stress_iterations > 0 ? args.stress_bytes : args.sweep.max_bytes) + 4 * 4096);
  xs::OwnedSegment segment(job_id, args.nprocs, args.staging_bytes, arena_bytes);
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int ordinal = 0; ordinal < args.nprocs; ++ordinal) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = replica(args, segment.name(), job_id, ordinal, memcpy_gbps);
      } catch (const std::exception& e) {
        fmt::print(stderr, "ordinal {}: {}\n", ordinal, e.what());
      }
      std::fflush(stdout);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  int failures = 0;
  for (size_t done = 0; done < pids.size(); ++done) {
    int status = 0;
    const pid_t pid = ::wait(&status);  // the collectives' own deadlines bound this wait
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failures;
      for (pid_t p : pids) {
        if (p != pid) ::kill(p, SIGTERM);
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    fmt::print(stderr, "all_reduce_sweep: {}\n", e.what());
    return 2;
  }
}
