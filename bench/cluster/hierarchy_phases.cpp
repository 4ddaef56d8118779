// Where the hierarchical all-reduce's time goes (a diagnostic beside multi_node_sweep), run
// under xla-spawn on every node of a multi-node job:
//
//   xla-spawn --nnodes 2 --node-rank K ... -n 2 -- hierarchy_phases [--min-bytes 1048576]
//       [--max-bytes 67108864] [--factor 4] [--reps 10] [--csv out/phases.csv]
//
// It builds the replica's communicator as xm::init() does (a MultiHostCommunicator over this
// node's ShmCommunicator and the job's store), keeping a pointer to the ShmCommunicator, and
// next to it a detail::NodeGroups of its own (the communicator's network side, under another
// store prefix). Per size, f32 sum of zeros in the node's arena, each after a job-wide barrier:
//   whole         MultiHostCommunicator::all_reduce
//   local_reduce, network, local_gather
//                 multi_host_all_reduce's three phases, one after the other:
//                 ShmCommunicator::reduce_ranges over the node's cut, detail::all_reduce_pieces
//                 (this replica's pieces over their groups), ShmCommunicator::gather_ranges
//   net_all       the network phase alone: every local ordinal's pieces at once, no local phases
//   net_one       gloo's ring among local ordinal 0 of every node over the whole buffer, the
//                 others idle: what one gloo stream gets from the link
// Times: the slowest replica's per iteration, median (a phase's time includes waiting in it
// for slower peers). CPU: the replicas' process CPU time summed, median. Ordinal 0 prints the
// table and writes the CSV (size_bytes,phase,time_us,cpu_us,gbps: size / time).
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "bench/collectives/sweep.h"
#include "xla_spawn/cluster/job_token.h"
#include "xla_spawn/cluster/store_client.h"
#include "xla_spawn/collectives/detail/hierarchy.h"
#include "xla_spawn/collectives/detail/node_groups.h"
#include "xla_spawn/collectives/detail/node_pieces.h"
#include "xla_spawn/collectives/multi_host_communicator.h"
#include "xla_spawn/replica/context.h"
#include "xla_spawn/shm/segment.h"
#include "xla_spawn/shm/wait.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  xs::bench::SweepOptions sizes{.min_bytes = size_t{1} << 20, .max_bytes = size_t{64} << 20};
  int reps = 10;
  std::string csv;
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto count = [&](int64_t min, int64_t max) {
      if (i + 1 >= argc) throw xs::InvalidArgument(arg + ": missing value");
      return xs::parse_int(argv[++i], min, max, arg);
    };
    if (arg == "--min-bytes") {
      args.sizes.min_bytes = static_cast<size_t>(count(4, int64_t{1} << 34));
    } else if (arg == "--max-bytes") {
      args.sizes.max_bytes = static_cast<size_t>(count(4, int64_t{1} << 34));
    } else if (arg == "--factor") {
      args.sizes.factor = static_cast<size_t>(count(2, 1 << 20));
    } else if (arg == "--reps") {
      args.reps = static_cast<int>(count(1, 100'000));
    } else if (arg == "--csv") {
      if (i + 1 >= argc) throw xs::InvalidArgument("--csv: missing value");
      args.csv = argv[++i];
    } else {
      throw xs::InvalidArgument("unknown argument " + arg +
                                " (expected --min-bytes, --max-bytes, --factor, --reps or --csv)");
    }
  }
  return args;
}

using xs::bench::median;
using xs::bench::process_cpu_seconds;

// The replica's two views of the same schedule: the communicator, and its pieces.
struct Rig {
  xs::ReplicaContext ctx;
  xs::ShmCommunicator* local = nullptr;  // owned by comm
  std::unique_ptr<xs::MultiHostCommunicator> comm;
  std::unique_ptr<xs::detail::NodeGroups> groups;
};

// As replica/xm.cpp builds a multi-node communicator, with a second store prefix for the
// phases' own group contexts.
Rig make_rig() {
  Rig rig;
  rig.ctx = xs::ReplicaContext::from_env();
  const auto token = xs::env_string(xs::cluster::kJobTokenEnv);
  if (!rig.ctx.multi_node() || rig.ctx.local_world_size < 2 || !token) {
    throw xs::InvalidArgument(
        "hierarchy_phases: run under xla-spawn with --nnodes >= 2 and "
        "-n >= 2 (a local phase needs two replicas per node)");
  }
  const int64_t timeout_ms = xs::collective_timeout_ms_from_env();
  auto store = std::make_shared<xs::cluster::StoreClient>(
      rig.ctx.master_addr, static_cast<uint16_t>(rig.ctx.master_port),
      xs::cluster::JobToken(*token, xs::cluster::kJobTokenEnv),
      std::chrono::milliseconds(timeout_ms));
  auto local = std::make_unique<xs::ShmCommunicator>(
      xs::Segment::attach(rig.ctx.segment_name, rig.ctx.local_ordinal, rig.ctx.local_world_size,
                          rig.ctx.segment_key()));
  rig.local = local.get();
  const xs::NodeTopology topology(rig.ctx.node_sizes, rig.ctx.node, rig.ctx.local_ordinal);
  const std::string prefix = fmt::format("{}/attempt-{}", rig.ctx.job_id, rig.ctx.attempt);
  xs::MultiHostCommunicatorOptions options;
  options.prefix = prefix + "/phases-comm";
  rig.comm = std::make_unique<xs::MultiHostCommunicator>(topology, std::move(local), store,
                                                         rig.ctx.host_addr, options);
  rig.groups = std::make_unique<xs::detail::NodeGroups>(topology, store, rig.ctx.host_addr,
                                                        prefix + "/phases-groups", timeout_ms);
  return rig;
}

struct Row {
  size_t bytes;
  std::string phase;
  double time_us;
  double cpu_us;
};

// Runs `iteration` reps times, each after a barrier; it stores each of its phases' seconds in
// the span it is given (phase_names.size() of them). Appends one row per phase on ordinal 0.
void measure(Rig& rig, int reps, size_t bytes, const std::vector<std::string>& phase_names,
             const std::function<void(std::vector<double>&)>& iteration, std::vector<Row>& rows) {
  const size_t phases = phase_names.size();
  std::vector<double> mine;  // [rep][phase] seconds, then [rep] CPU seconds
  std::vector<double> cpu;
  std::vector<double> phase_seconds(phases);
  rig.comm->barrier();
  iteration(phase_seconds);  // warm-up: the first call connects the group contexts
  for (int r = 0; r < reps; ++r) {
    rig.comm->barrier();
    const double cpu_start = process_cpu_seconds();
    iteration(phase_seconds);
    cpu.push_back(process_cpu_seconds() - cpu_start);
    mine.insert(mine.end(), phase_seconds.begin(), phase_seconds.end());
  }
  mine.insert(mine.end(), cpu.begin(), cpu.end());
  const int world = rig.comm->world_size();
  std::vector<double> all(mine.size() * static_cast<size_t>(world));
  rig.comm->all_gather(mine.data(), all.data(), mine.size(), xs::DType::kF64);
  if (rig.comm->ordinal() != 0) return;
  const auto n_reps = static_cast<size_t>(reps);
  for (size_t p = 0; p < phases; ++p) {
    std::vector<double> slowest(n_reps, 0.0), cpu_sum(n_reps, 0.0);
    for (int k = 0; k < world; ++k) {
      const double* theirs = all.data() + static_cast<size_t>(k) * mine.size();
      for (size_t r = 0; r < n_reps; ++r) {
        slowest[r] = std::max(slowest[r], theirs[r * phases + p]);
        cpu_sum[r] += theirs[n_reps * phases + r];
      }
    }
    // CPU is per iteration, not per phase: it goes on the first row of the measurement.
    rows.push_back(
        {bytes, phase_names[p], median(slowest) * 1e6, p == 0 ? median(cpu_sum) * 1e6 : 0});
  }
}

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void measure_size(Rig& rig, float* data, size_t n, int reps, std::vector<Row>& rows) {
  const size_t bytes = n * sizeof(float);
  std::fill(data, data + n, 0.0f);
  auto* raw = reinterpret_cast<std::byte*>(data);
  const xs::NodeTopology& t = rig.comm->topology();
  const std::vector<size_t> cut = xs::detail::node_cut(n, t.local_world_size(), sizeof(float));
  const xs::detail::Hierarchy hierarchy{t, rig.local, *rig.groups};
  auto network = [&] {
    xs::detail::all_reduce_pieces(hierarchy, raw, n, xs::DType::kF32, xs::ReduceOp::kSum);
  };
  rig.groups->set_call({"all_reduce", xs::DType::kF32, n});
  measure(
      rig, reps, bytes, {"whole"},
      [&](std::vector<double>& s) {
        const auto start = Clock::now();
        rig.comm->all_reduce(data, n, xs::DType::kF32, xs::ReduceOp::kSum);
        s[0] = since(start);
      },
      rows);
  measure(
      rig, reps, bytes, {"local_reduce", "network", "local_gather"},
      [&](std::vector<double>& s) {
        auto start = Clock::now();
        rig.local->reduce_ranges(data, n, xs::DType::kF32, xs::ReduceOp::kSum, cut);
        s[0] = since(start);
        start = Clock::now();
        network();
        s[1] = since(start);
        start = Clock::now();
        rig.local->gather_ranges(data, n, xs::DType::kF32, cut);
        s[2] = since(start);
      },
      rows);
  measure(
      rig, reps, bytes, {"net_all"},
      [&](std::vector<double>& s) {
        const auto start = Clock::now();
        network();
        s[0] = since(start);
      },
      rows);
  const std::vector<int> leaders(static_cast<size_t>(t.nnodes()), 0);
  measure(
      rig, reps, bytes, {"net_one"},
      [&](std::vector<double>& s) {
        const auto start = Clock::now();
        if (t.local_ordinal() == 0)
          rig.groups->all_reduce(leaders, raw, n, xs::DType::kF32, xs::ReduceOp::kSum);
        s[0] = since(start);
      },
      rows);
}

void report(const std::vector<Row>& rows, const Args& args, const xs::ReplicaContext& ctx) {
  fmt::print(
      "# hierarchical all-reduce by phase, {} nodes x {} replicas, f32 sum of zeros; "
      "median over {} iterations of the slowest replica\n",
      ctx.nnodes, ctx.local_world_size, args.reps);
  fmt::print("{:>10} {:>13} {:>11} {:>11} {:>9}\n", "size(B)", "phase", "time(us)", "cpu(us)",
             "GB/s");
  for (const Row& r : rows) {
    fmt::print("{:>10} {:>13} {:>11.1f} {:>11} {:>9.3f}\n", r.bytes, r.phase, r.time_us,
               r.cpu_us > 0 ? fmt::format("{:.1f}", r.cpu_us) : "", r.bytes / r.time_us * 1e-3);
  }
  std::fflush(stdout);
  if (args.csv.empty()) return;
  std::FILE* file = std::fopen(args.csv.c_str(), "w");
  if (file == nullptr) throw xs::IoError(xs::errno_message("cannot write " + args.csv, errno));
  fmt::print(file, "size_bytes,phase,time_us,cpu_us,gbps\n");
  for (const Row& r : rows) {
    fmt::print(file, "{},{},{:.2f},{:.1f},{:.4f}\n", r.bytes, r.phase, r.time_us, r.cpu_us,
               r.bytes / r.time_us * 1e-3);
  }
  if (std::fclose(file) != 0)
    throw xs::IoError(xs::errno_message("cannot write " + args.csv, errno));
}

int run(const Args& args) {
  Rig rig = make_rig();
  const size_t capacity = args.sizes.max_bytes / sizeof(float) + 1;
  auto* data = static_cast<float*>(rig.comm->alloc_buffer(capacity * sizeof(float)));
  std::vector<Row> rows;
  for (size_t bytes : xs::bench::sweep_sizes(args.sizes)) {
    measure_size(rig, data, bytes / sizeof(float), args.reps, rows);
  }
  if (rig.comm->ordinal() == 0) report(rows, args, rig.ctx);
  rig.comm->free_buffer(data);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    fmt::print(stderr, "hierarchy_phases: {}\n", e.what());
    return 2;
  }
}
