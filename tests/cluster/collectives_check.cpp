// collectives_check: a replica program for the multi-node job tests
// (tests/cluster/multi_node_job_test.cpp). Under xla-spawn it takes xm::communicator() (a
// MultiHostCommunicator in a multi-node job) through every collective, checks each result
// against its closed form (tests/collectives/test_data.h: values derived from (ordinal,
// index), exact in every dtype) and prints one line per combination on stdout,
//   FP all_reduce/bf16/mean/n=65553 1f0c2b9a7d3e4c51
// the fingerprint of the result's bytes, so the test can check that every ordinal of the job
// ended with the same bits. Every result is one all replicas hold (reduce-scatter's chunks are
// gathered before they are fingerprinted). A wrong result is printed on stderr, "WRONG <name>:
// <what and where>"; the sweep goes on (every replica still makes every call, so no peer is
// left waiting) and the program exits 1 at the end.
//
//   xla-spawn --nnodes 2 --node-rank 0 --master-addr A -n 2 -- collectives_check [--quick]
//
// --quick runs a few small all-reduces and one barrier (the 32-node test): none in bf16,
// whose sums stop being exact past 8 ordinals.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/replica/xm.h"
#include "tests/collectives/test_data.h"

namespace xs::testing {
namespace {

// 64 Ki + 17 and the prime 300007: odd counts past one node's staging and across pieces.
constexpr size_t kCounts[] = {0, 1, 7, 1023, 65536 + 17, 300007};
constexpr DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin};
// Collectives that only move bytes: one dtype per element size.
constexpr DType kElementSizes[] = {DType::kBF16, DType::kI32, DType::kF64};

// Prints each combination's fingerprint and counts the wrong ones.
class Report {
 public:
  void record(const std::string& name, std::span<const std::byte> result,
              const std::string& error) {
    if (!error.empty()) {
      fmt::print(stderr, "WRONG {} (ordinal {}): {}\n", name, xm::ordinal(), error);
      std::fflush(stderr);
      ++wrong_;
    }
    fmt::print("FP {} {:016x}\n", name, fingerprint(result.data(), result.size()));
    std::fflush(stdout);
    ++combinations_;
  }
  int wrong() const { return wrong_; }
  int combinations() const { return combinations_; }

 private:
  int wrong_ = 0;
  int combinations_ = 0;
};

// Where the first of `got`'s bytes differs from `want`'s, as "byte i of n", or "".
std::string first_difference(std::span<const std::byte> got, std::span<const std::byte> want) {
  if (got.size() != want.size())
    return fmt::format("{} bytes, expected {}", got.size(), want.size());
  const auto [g, w] = std::mismatch(got.begin(), got.end(), want.begin());
  if (g == got.end()) return "";
  return fmt::format("byte {} of {}: {:#04x}, expected {:#04x}", g - got.begin(), got.size(),
                     static_cast<unsigned>(*g), static_cast<unsigned>(*w));
}

// One all_reduce of this ordinal's make_input, its operand from the node's buffer arena or
// from the heap (which the communicator stages): half the calls each, alternating by ordinal,
// so a call mixes both kinds across replicas.
void all_reduce_one(Report& report, DType dtype, ReduceOp op, size_t n, bool from_arena) {
  Communicator& comm = xm::communicator();
  std::vector<std::byte> data = make_input(dtype, xm::ordinal(), n);
  if (from_arena && n > 0) {
    void* operand = comm.alloc_buffer(data.size());
    std::memcpy(operand, data.data(), data.size());
    comm.all_reduce(operand, n, dtype, op);
    std::memcpy(data.data(), operand, data.size());
    comm.free_buffer(operand);
  } else {
    comm.all_reduce(data.data(), n, dtype, op);
  }
  std::string why;
  const size_t wrong = count_wrong(data, dtype, op, xm::world_size(), &why);
  report.record(fmt::format("all_reduce/{}/{}/n={}", dtype_name(dtype), reduce_op_name(op), n),
                data, wrong == 0 ? "" : fmt::format("{} wrong elements, first: {}", wrong, why));
}

void all_reduce_sweep(Report& report) {
  int call = 0;
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllOps) {
      for (size_t n : kCounts)
        all_reduce_one(report, dtype, op, n, (xm::ordinal() + call++) % 2 == 0);
    }
  }
}

// The first and last ordinals, and a replica of a node other than 0 that is not its leader
// (local ordinal 0), when there is one.
std::vector<int> broadcast_roots() {
  const ReplicaContext& ctx = xm::context();
  std::vector<int> roots = {0, ctx.world_size - 1};
  int first = 0;
  for (size_t node = 0; node < ctx.node_sizes.size(); ++node) {
    if (node > 0 && ctx.node_sizes[node] > 1) {
      roots.push_back(first + 1);
      break;
    }
    first += ctx.node_sizes[node];
  }
  std::sort(roots.begin(), roots.end());
  roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
  return roots;
}

void broadcast_sweep(Report& report) {
  for (int root : broadcast_roots()) {
    for (DType dtype : kElementSizes) {
      for (size_t n : kCounts) {
        std::vector<std::byte> data = make_input(dtype, xm::ordinal(), n);
        xm::communicator().broadcast(data.data(), n, dtype, root);
        report.record(fmt::format("broadcast/root={}/{}/n={}", root, dtype_name(dtype), n), data,
                      first_difference(data, make_input(dtype, root, n)));
      }
    }
  }
}

// make_input of every ordinal, in ordinal order: what an all-gather of make_input returns.
std::vector<std::byte> gathered_inputs(DType dtype, size_t n) {
  std::vector<std::byte> whole;
  for (int k = 0; k < xm::world_size(); ++k) {
    const std::vector<std::byte> part = make_input(dtype, k, n);
    whole.insert(whole.end(), part.begin(), part.end());
  }
  return whole;
}

void all_gather_sweep(Report& report) {
  for (DType dtype : kElementSizes) {
    for (size_t n : kCounts) {
      const std::vector<std::byte> in = make_input(dtype, xm::ordinal(), n);
      std::vector<std::byte> out(in.size() * static_cast<size_t>(xm::world_size()));
      xm::communicator().all_gather(in.data(), out.data(), n, dtype);
      report.record(fmt::format("all_gather/{}/n={}", dtype_name(dtype), n), out,
                    first_difference(out, gathered_inputs(dtype, n)));
    }
  }
}

// Two pieces, the first and last third of the gathered elements: they straddle ordinals'
// blocks and leave the middle third out.
void all_gather_pieces_sweep(Report& report) {
  constexpr DType kDType = DType::kF32;
  for (size_t n : kCounts) {
    const std::vector<std::byte> in = make_input(kDType, xm::ordinal(), n);
    const std::vector<std::byte> whole = gathered_inputs(kDType, n);
    const size_t third = whole.size() / dtype_size(kDType) / 3 * dtype_size(kDType);
    std::vector<std::byte> pieces_bytes(third + whole.size() - 2 * third);
    const GatherPiece pieces[] = {
        {0, third, pieces_bytes.data()},
        {2 * third, whole.size() - 2 * third, pieces_bytes.data() + third}};
    xm::communicator().all_gather_pieces(in.data(), pieces, n, kDType);
    std::vector<std::byte> want(whole.begin(), whole.begin() + static_cast<ptrdiff_t>(third));
    want.insert(want.end(), whole.begin() + static_cast<ptrdiff_t>(2 * third), whole.end());
    report.record(fmt::format("all_gather_pieces/{}/n={}", dtype_name(kDType), n), pieces_bytes,
                  first_difference(pieces_bytes, want));
  }
}

// Ordinal o's input is make_input(o) of world_size * n elements, so its chunk is the closed
// form's elements o * n .. (o + 1) * n - 1. The chunks are then all-gathered, so the
// fingerprint covers the whole reduction, which every ordinal holds.
void reduce_scatter_sweep(Report& report) {
  constexpr std::pair<DType, ReduceOp> kCases[] = {{DType::kF32, ReduceOp::kSum},
                                                   {DType::kF64, ReduceOp::kMean},
                                                   {DType::kBF16, ReduceOp::kSum},
                                                   {DType::kI64, ReduceOp::kMax}};
  const auto w = static_cast<size_t>(xm::world_size());
  const auto ordinal = static_cast<size_t>(xm::ordinal());
  for (const auto& [dtype, op] : kCases) {
    for (size_t n : kCounts) {
      const size_t chunk_bytes = n * dtype_size(dtype);
      const std::vector<std::byte> in = make_input(dtype, xm::ordinal(), w * n);
      std::vector<std::byte> chunk(chunk_bytes);
      xm::communicator().reduce_scatter(in.data(), chunk.data(), n, dtype, op);
      const std::vector<std::byte> want = expected_result(dtype, op, xm::world_size(), w * n);
      std::string error =
          first_difference(chunk, std::span(want).subspan(ordinal * chunk_bytes, chunk_bytes));
      std::vector<std::byte> whole(w * chunk_bytes);
      xm::communicator().all_gather(chunk.data(), whole.data(), n, dtype);
      if (error.empty()) error = first_difference(whole, want);
      report.record(
          fmt::format("reduce_scatter/{}/{}/n={}", dtype_name(dtype), reduce_op_name(op), n), whole,
          error.empty() ? "" : "chunks gathered from every ordinal: " + error);
    }
  }
}

int64_t realtime_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_REALTIME, &t);
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

// Round r: ordinal r arrives 50 ms after the others (a deliberate late arrival, the stimulus:
// without it a barrier that released everyone at once would pass unnoticed). Every replica
// must leave after the last arrival. Arrivals and departures are read from CLOCK_REALTIME,
// one clock for the simulated hosts of one machine (real hosts: NTP keeps them far closer
// than 50 ms). The fingerprint is of (round, world size): the bits say the check passed.
void barrier_check(Report& report, int rounds) {
  constexpr auto kLate = std::chrono::milliseconds(50);
  for (int r = 0; r < rounds; ++r) {
    if (rounds > 1 && xm::ordinal() == r % xm::world_size()) std::this_thread::sleep_for(kLate);
    const int64_t arrived = realtime_ns();
    xm::communicator().barrier();
    const int64_t left = realtime_ns();
    std::vector<int64_t> arrivals(static_cast<size_t>(xm::world_size()));
    xm::communicator().all_gather(&arrived, arrivals.data(), 1, DType::kI64);
    const auto last = std::max_element(arrivals.begin(), arrivals.end());
    const std::string error = left >= *last
                                  ? ""
                                  : fmt::format("left at {} ns, before ordinal {} arrived at {} ns",
                                                left, last - arrivals.begin(), *last);
    const int64_t identity[] = {r, xm::world_size()};
    report.record(fmt::format("barrier/round={}", r), std::as_bytes(std::span(identity)), error);
  }
}

// Ordinal 0's payload is always empty; round 2's are empty everywhere.
std::string payload_of(int ordinal, int round) {
  if (round == 2) return "";
  return std::string(static_cast<size_t>(ordinal * 1237 * (round + 1)) % 3001,
                     static_cast<char>('a' + ordinal % 26));
}

void rendezvous_sweep(Report& report) {
  for (int round = 0; round < 3; ++round) {
    const std::string mine = payload_of(xm::ordinal(), round);
    const std::vector<std::vector<std::byte>> all = xm::communicator().rendezvous(
        fmt::format("check-{}", round), std::as_bytes(std::span(mine)));
    std::string error;
    std::vector<std::byte> bytes;  // every payload after its length, in ordinal order
    if (all.size() != static_cast<size_t>(xm::world_size())) {
      error = fmt::format("{} payloads, expected {}", all.size(), xm::world_size());
    }
    for (size_t k = 0; k < all.size(); ++k) {
      const std::string want = payload_of(static_cast<int>(k), round);
      if (error.empty()) {
        error = first_difference(all[k], std::as_bytes(std::span(want)));
        if (!error.empty()) error = fmt::format("payload of ordinal {}: {}", k, error);
      }
      const uint64_t size = all[k].size();
      const auto* size_bytes = reinterpret_cast<const std::byte*>(&size);
      bytes.insert(bytes.end(), size_bytes, size_bytes + sizeof size);
      bytes.insert(bytes.end(), all[k].begin(), all[k].end());
    }
    report.record(fmt::format("rendezvous/round={}", round), bytes, error);
  }
}

void quick(Report& report) {
  all_reduce_one(report, DType::kF32, ReduceOp::kSum, 1, false);
  all_reduce_one(report, DType::kF32, ReduceOp::kMean, 1023, true);
  all_reduce_one(report, DType::kF64, ReduceOp::kSum, 7, false);
  all_reduce_one(report, DType::kI32, ReduceOp::kMax, 1023, false);
  all_reduce_one(report, DType::kI64, ReduceOp::kMin, 65536 + 17, true);
  barrier_check(report, 1);
}

void full(Report& report) {
  all_reduce_sweep(report);
  broadcast_sweep(report);
  all_gather_sweep(report);
  all_gather_pieces_sweep(report);
  reduce_scatter_sweep(report);
  barrier_check(report, xm::world_size());
  rendezvous_sweep(report);
}

}  // namespace
}  // namespace xs::testing

int main(int argc, char** argv) try {
  const bool quick = argc == 2 && std::string(argv[1]) == "--quick";
  if (argc > 2 || (argc == 2 && !quick)) {
    std::fprintf(stderr, "usage: collectives_check [--quick]\n");
    return 2;
  }
  xs::xm::init();
  xs::testing::Report report;
  if (quick) {
    xs::testing::quick(report);
  } else {
    xs::testing::full(report);
  }
  fmt::print(stderr, "collectives_check: ordinal {} of {}: {} combinations, {} wrong\n",
             xs::xm::ordinal(), xs::xm::world_size(), report.combinations(), report.wrong());
  xs::xm::shutdown();
  return report.wrong() == 0 ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "collectives_check: {}\n", e.what());
  return 1;
}
