// All-reduce sweep of a multi-node job, run under xla-spawn on every node: the project's
// hierarchical all-reduce (xm::communicator(), a MultiHostCommunicator: shared memory inside a
// node, gloo between nodes) against a flat gloo ring over all replicas (flat_gloo.h: what
// torch.distributed's gloo backend does), f32 sum in place, 8 B .. 64 MiB by a factor of 4.
//
//   xla-spawn --nnodes 2 --node-rank K --master-addr ADDR --master-port P -n 2 --
//     multi_node_sweep [--min-bytes 8] [--max-bytes 67108864] [--factor 4] [--reps 20]
//                      [--csv out/sweep.csv] [--impl both|hierarchical|flat_gloo]
//   ... -- multi_node_sweep --quick      # 3 verified small hierarchical all-reduces (start-up)
//
// The method (verification, timing, CPU and wire bytes, CSV) is multi_node_bench.h's. The
// barrier between iterations is the communicator's, for both contenders. The hierarchical
// all-reduce's operand comes from alloc_buffer (the node's arena, as the runtime's gradients
// do); the flat ring's from the heap (as a CPU tensor's). Ordinal 0 prints the table and the
// contexts' connect times and writes the CSV; the exit status is 1 if any element was wrong.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench/cluster/flat_gloo.h"
#include "bench/cluster/multi_node_bench.h"
#include "xla_spawn/collectives/multi_host_communicator.h"
#include "xla_spawn/replica/xm.h"

namespace {

using xs::bench::Contender;

xs::bench::JobHooks job_hooks(xs::Communicator& comm) {
  const xs::ReplicaContext& ctx = xs::xm::context();
  xs::bench::JobHooks job;
  job.ordinal = ctx.ordinal;
  job.world_size = ctx.world_size;
  job.nnodes = ctx.nnodes;
  job.local_world_size = ctx.local_world_size;
  job.reads_link = ctx.local_ordinal == 0;
  job.barrier = [&comm] { comm.barrier(); };
  job.all_gather = [&comm](const double* in, double* out, size_t n) {
    comm.all_gather(in, out, n, xs::DType::kF64);
  };
  job.sum = [&comm](int64_t value) {
    comm.all_reduce(&value, 1, xs::DType::kI64, xs::ReduceOp::kSum);
    return value;
  };
  return job;
}

// What the contenders own: the arena operand and the flat ring's context and heap operand.
struct Operands {
  explicit Operands(xs::Communicator& c) : comm(c) {}
  Operands(const Operands&) = delete;
  Operands& operator=(const Operands&) = delete;
  xs::Communicator& comm;
  float* arena = nullptr;
  std::unique_ptr<xs::bench::FlatGloo> flat;
  std::vector<float> heap;
  ~Operands() {
    if (arena != nullptr) comm.free_buffer(arena);
  }
};

// The contenders in the order asked for; the flat ring's context connects here (collective).
std::vector<Contender> make_contenders(const xs::bench::MultiNodeArgs& args, Operands& own) {
  const size_t capacity = args.sizes.max_bytes / sizeof(float) + 1;
  std::vector<Contender> contenders;
  for (const std::string& name : args.contenders) {
    if (name == "hierarchical") {
      own.arena = static_cast<float*>(own.comm.alloc_buffer(capacity * sizeof(float)));
      contenders.push_back({name, own.arena, [&comm = own.comm](float* d, size_t n) {
                              comm.all_reduce(d, n, xs::DType::kF32, xs::ReduceOp::kSum);
                            }});
    } else {
      own.flat = std::make_unique<xs::bench::FlatGloo>(xs::xm::context(), "bench-flat-gloo");
      own.heap.assign(capacity, 0.0f);
      contenders.push_back({name, own.heap.data(), [flat = own.flat.get()](float* d, size_t n) {
                              flat->all_reduce(d, n);
                            }});
    }
  }
  return contenders;
}

// Connection set-up: the hierarchical groups connect lazily, at the first all-reduce; the flat
// mesh in its constructor.
void print_connects(const xs::Communicator& comm, const xs::bench::FlatGloo* flat) {
  const auto* multi = dynamic_cast<const xs::MultiHostCommunicator*>(&comm);
  if (multi == nullptr) return;
  fmt::print("# connect (ordinal 0): hierarchical {} group context(s) in {:.1f} ms",
             multi->group_contexts(), multi->connect_seconds() * 1e3);
  if (flat != nullptr) fmt::print("; flat gloo mesh in {:.1f} ms", flat->connect_seconds() * 1e3);
  fmt::print("\n");
}

int run(const xs::bench::MultiNodeArgs& args) {
  xs::xm::init();
  xs::Communicator& comm = xs::xm::communicator();
  const xs::bench::JobHooks job = job_hooks(comm);
  Operands own(comm);
  const std::vector<Contender> contenders = make_contenders(args, own);
  const auto rows = xs::bench::run_multi_node_sweep(args, job, contenders);
  if (job.ordinal == 0) print_connects(comm, own.flat.get());
  return xs::bench::report_multi_node_sweep(rows, job, args, "multi_node_sweep");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(xs::bench::parse_multi_node_args(argc, argv, {"hierarchical", "flat_gloo"}));
  } catch (const std::exception& e) {
    fmt::print(stderr, "multi_node_sweep: {}\n", e.what());
    return 2;
  }
}
