#include "bench/cluster/multi_node_bench.h"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "bench/cluster/link_bytes.h"
#include "bench/collectives/sweep.h"

namespace xs::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Exact in f32 in any order: (ordinal + 1) * (1..7) sums to world(world + 1)/2 * (1..7), below
// 2^24 up to 2000 replicas.
float input(int ordinal, size_t i) {
  return static_cast<float>((ordinal + 1) * static_cast<int>(i % 7 + 1));
}

// Wrong elements after one all-reduce of inputs from (ordinal, index), summed over the job.
int64_t verify(const JobHooks& job, const Contender& c, size_t n) {
  for (size_t i = 0; i < n; ++i) c.data[i] = input(job.ordinal, i);
  c.all_reduce(c.data, n);
  const float total = static_cast<float>(job.world_size * (job.world_size + 1) / 2);
  int64_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += c.data[i] != total * static_cast<float>(i % 7 + 1);
  return job.sum(wrong);
}

// This replica's seconds and CPU seconds per iteration, and on a link reader its node's eth0
// bytes over the loop.
struct Timed {
  std::vector<double> seconds;
  std::vector<double> cpu_seconds;
  std::optional<LinkBytes> bytes;
};

Timed time_iterations(const JobHooks& job, const Contender& c, size_t n, int reps) {
  std::fill(c.data, c.data + n, 0.0f);  // sums of zeros stay zero: no inf/NaN slow paths
  Timed t;
  job.barrier();
  const auto before = job.reads_link ? read_link_bytes("eth0") : std::nullopt;
  for (int r = 0; r < reps; ++r) {
    job.barrier();
    const double cpu_start = process_cpu_seconds();
    const auto start = Clock::now();
    c.all_reduce(c.data, n);
    t.seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    t.cpu_seconds.push_back(process_cpu_seconds() - cpu_start);
  }
  job.barrier();  // every peer has received everything this node sent
  const auto after = job.reads_link ? read_link_bytes("eth0") : std::nullopt;
  if (before && after) t.bytes = LinkBytes{after->tx - before->tx, after->rx - before->rx};
  return t;
}

// Gathers every replica's iteration times and link bytes (collective).
MultiNodeRow summarize(const JobHooks& job, const Timed& t, size_t n) {
  const size_t reps = t.seconds.size();
  // Per replica: its iteration times, their CPU times, then tx and rx per op (-1: not a
  // link reader).
  std::vector<double> mine = t.seconds;
  mine.insert(mine.end(), t.cpu_seconds.begin(), t.cpu_seconds.end());
  mine.push_back(t.bytes ? static_cast<double>(t.bytes->tx) / static_cast<double>(reps) : -1);
  mine.push_back(t.bytes ? static_cast<double>(t.bytes->rx) / static_cast<double>(reps) : -1);
  std::vector<double> all(mine.size() * static_cast<size_t>(job.world_size));
  job.all_gather(mine.data(), all.data(), mine.size());
  std::vector<double> slowest(reps, 0.0), cpu(reps, 0.0);
  MultiNodeRow row;
  row.bytes = n * sizeof(float);
  for (int k = 0; k < job.world_size; ++k) {
    const double* theirs = all.data() + static_cast<size_t>(k) * mine.size();
    for (size_t r = 0; r < reps; ++r) {
      slowest[r] = std::max(slowest[r], theirs[r]);
      cpu[r] += theirs[reps + r];
    }
    if (theirs[2 * reps] >= 0) {
      row.tx_per_op = std::max(row.tx_per_op.value_or(0), theirs[2 * reps]);
      row.rx_per_op = std::max(row.rx_per_op.value_or(0), theirs[2 * reps + 1]);
    }
  }
  const double seconds = median(slowest);
  row.time_us = seconds * 1e6;
  row.cpu_us = median(cpu) * 1e6;
  row.algbw_gbps = static_cast<double>(row.bytes) / seconds * 1e-9;
  row.busbw_gbps = row.algbw_gbps * 2.0 * (job.world_size - 1) / job.world_size;
  return row;
}

std::string optional_number(const std::optional<double>& value, int decimals) {
  return value ? fmt::format("{:.{}f}", *value, decimals) : "";
}

std::optional<double> payload_ratio(const MultiNodeRow& r) {
  if (!r.tx_per_op) return std::nullopt;
  return *r.tx_per_op / static_cast<double>(r.bytes);
}

std::vector<std::string> parse_impls(const std::string& text,
                                     const std::vector<std::string>& known) {
  if (text == "both" || text == "all") return known;
  std::vector<std::string> names;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string name = text.substr(at, comma - at);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      throw InvalidArgument(fmt::format("--impl {}: '{}' is not one of {} (or both)", text, name,
                                        fmt::join(known, ", ")));
    }
    names.push_back(name);
    at = comma + 1;
  }
  return names;
}

}  // namespace

MultiNodeArgs parse_multi_node_args(int argc, char** argv, const std::vector<std::string>& known) {
  MultiNodeArgs args;
  args.contenders = known;
  bool impl_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw InvalidArgument(arg + ": missing value");
      return argv[++i];
    };
    auto count = [&](int64_t min, int64_t max) { return parse_int(value(), min, max, arg); };
    if (arg == "--min-bytes") {
      args.sizes.min_bytes = static_cast<size_t>(count(4, int64_t{1} << 34));
    } else if (arg == "--max-bytes") {
      args.sizes.max_bytes = static_cast<size_t>(count(4, int64_t{1} << 34));
    } else if (arg == "--factor") {
      args.sizes.factor = static_cast<size_t>(count(2, 1 << 20));
    } else if (arg == "--reps") {
      args.reps = static_cast<int>(count(1, 100'000));
    } else if (arg == "--csv") {
      args.csv = value();
    } else if (arg == "--quick") {
      args.quick = true;
    } else if (arg == "--impl") {
      args.contenders = parse_impls(value(), known);
      impl_given = true;
    } else {
      throw InvalidArgument(
          fmt::format("unknown argument {} (expected --min-bytes, --max-bytes, "
                      "--factor, --reps, --csv, --impl or --quick)",
                      arg));
    }
  }
  if (args.quick) {
    args.sizes = {.min_bytes = 8, .max_bytes = 32768, .factor = 64};
    args.reps = 4;
    if (!impl_given) args.contenders = {known.front()};
  }
  if (args.sizes.min_bytes > args.sizes.max_bytes) {
    throw InvalidArgument(fmt::format("--min-bytes {} exceeds --max-bytes {}", args.sizes.min_bytes,
                                      args.sizes.max_bytes));
  }
  return args;
}

std::vector<MultiNodeRow> run_multi_node_sweep(const MultiNodeArgs& args, const JobHooks& job,
                                               const std::vector<Contender>& contenders) {
  std::vector<MultiNodeRow> rows;
  const std::vector<size_t> sizes = sweep_sizes(args.sizes);
  for (size_t s = 0; s < sizes.size(); ++s) {
    const size_t n = sizes[s] / sizeof(float);
    for (size_t i = 0; i < contenders.size(); ++i) {
      // Odd sizes run the contenders in reverse: none always follows another.
      const size_t c = s % 2 == 0 ? i : contenders.size() - 1 - i;
      const int64_t wrong = verify(job, contenders[c], n);
      MultiNodeRow row = summarize(job, time_iterations(job, contenders[c], n, args.reps), n);
      row.contender = c;
      row.name = contenders[c].name;
      row.wrong = wrong;
      rows.push_back(row);
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const MultiNodeRow& a, const MultiNodeRow& b) {
    return a.bytes != b.bytes ? a.bytes < b.bytes : a.contender < b.contender;
  });
  return rows;
}

void print_multi_node_table(const std::vector<MultiNodeRow>& rows, const JobHooks& job, int reps) {
  fmt::print(
      "# multi-node all-reduce, {} nodes, {} replicas, f32 sum in place; median over {} "
      "iterations of the slowest replica\n",
      job.nnodes, job.world_size, reps);
  fmt::print("{:>10} {:>13} {:>11} {:>9} {:>9} {:>11} {:>12} {:>7} {:>6}\n", "size(B)", "impl",
             "time(us)", "algbw", "busbw", "cpu(us)", "tx/op(B)", "tx/size", "wrong");
  for (const MultiNodeRow& r : rows) {
    const auto ratio = payload_ratio(r);
    fmt::print("{:>10} {:>13} {:>11.1f} {:>9.4f} {:>9.4f} {:>11.1f} {:>12} {:>7} {:>6}\n", r.bytes,
               r.name, r.time_us, r.algbw_gbps, r.busbw_gbps, r.cpu_us,
               r.tx_per_op ? optional_number(r.tx_per_op, 0) : "-",
               ratio ? optional_number(ratio, 3) : "-", r.wrong);
  }
  std::fflush(stdout);
}

void write_multi_node_csv(const std::string& path, const std::vector<MultiNodeRow>& rows,
                          const JobHooks& job, int reps) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) throw IoError(errno_message("cannot write " + path, errno));
  fmt::print(file,
             "world_size,nnodes,size_bytes,n_elems,implementation,time_us,algbw_gbps,busbw_gbps,"
             "tx_bytes_per_op,rx_bytes_per_op,payload_ratio,wrong,reps,cpu_us\n");
  for (const MultiNodeRow& r : rows) {
    fmt::print(file, "{},{},{},{},{},{:.2f},{:.5f},{:.5f},{},{},{},{},{},{:.1f}\n", job.world_size,
               job.nnodes, r.bytes, r.bytes / sizeof(float), r.name, r.time_us, r.algbw_gbps,
               r.busbw_gbps, optional_number(r.tx_per_op, 1), optional_number(r.rx_per_op, 1),
               optional_number(payload_ratio(r), 4), r.wrong, reps, r.cpu_us);
  }
  if (std::fclose(file) != 0) throw IoError(errno_message("cannot write " + path, errno));
}

int report_multi_node_sweep(const std::vector<MultiNodeRow>& rows, const JobHooks& job,
                            const MultiNodeArgs& args, const char* program) {
  int64_t wrong = 0;
  for (const auto& row : rows) wrong += row.wrong;
  if (job.ordinal == 0) {
    print_multi_node_table(rows, job, args.reps);
    if (!args.csv.empty()) write_multi_node_csv(args.csv, rows, job, args.reps);
    if (wrong > 0) fmt::print(stderr, "{}: {} wrong elements in all\n", program, wrong);
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace xs::bench
