#include "bench/collectives/sweep.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include <fmt/format.h>

namespace xs::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Exact in f32 in any order: small integers, sum at most 7 * 8 * 9 / 2 = 252.
float input(int ordinal, size_t i) {
  return static_cast<float>((ordinal + 1) * (i % 7 + 1));
}

size_t verify(const SweepHooks& hooks, float* data, size_t n) {
  for (size_t i = 0; i < n; ++i) data[i] = input(hooks.ordinal, i);
  hooks.all_reduce(data, n);
  const int total = hooks.world_size * (hooks.world_size + 1) / 2;
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += data[i] != static_cast<float>(total * (i % 7 + 1));
  return wrong;
}

// Seconds per call, median over repetitions; every ordinal times the same iterations.
double time_all_reduce(const SweepOptions& options, const SweepHooks& hooks, float* data,
                       size_t n) {
  std::fill(data, data + n, 0.0f);  // sums of zeros stay zero: no inf/NaN slow paths
  hooks.barrier();
  // Warm up in doubling batches until a batch lasts 2 ms on ordinal 0 (whose verdict every
  // ordinal follows, so all make the same calls); its time per call sizes the repetitions.
  double warm_s = 0;
  for (int64_t batch = 2;; batch *= 2) {
    const auto start = Clock::now();
    for (int64_t i = 0; i < batch; ++i) hooks.all_reduce(data, n);
    warm_s =
        std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(batch);
    const bool enough = warm_s * static_cast<double>(batch) > 2e-3 || batch >= (1 << 16);
    if (hooks.broadcast_from_0(enough ? 1 : 0) == 1) break;
  }
  const int64_t iterations = hooks.broadcast_from_0(
      std::clamp<int64_t>(static_cast<int64_t>(options.repetition_ms * 1e-3 / warm_s), 1, 100'000));
  std::vector<double> per_call;
  for (int r = 0; r < options.repetitions; ++r) {
    hooks.barrier();
    const auto begin = Clock::now();
    for (int64_t i = 0; i < iterations; ++i) hooks.all_reduce(data, n);
    per_call.push_back(std::chrono::duration<double>(Clock::now() - begin).count() /
                       static_cast<double>(iterations));
  }
  return median(per_call);
}

}  // namespace

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double process_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::vector<size_t> sweep_sizes(const SweepOptions& options) {
  std::vector<size_t> sizes;
  for (size_t s = options.min_bytes; s <= options.max_bytes; s *= options.factor) {
    sizes.push_back(s);
  }
  // 8 B x 4^k never lands on 256 MiB: always end with the largest size asked for.
  if (sizes.empty() || sizes.back() != options.max_bytes) sizes.push_back(options.max_bytes);
  return sizes;
}

std::vector<SweepRow> run_sweep(const SweepOptions& options, const SweepHooks& hooks) {
  const std::vector<size_t> sizes = sweep_sizes(options);
  const size_t capacity = options.max_bytes / sizeof(float) + 1;
  std::vector<float> heap;
  float* buffer = nullptr;
  if (hooks.allocate) {
    buffer = hooks.allocate(capacity);
  } else {
    heap.resize(capacity);
    buffer = heap.data();
  }
  std::vector<SweepRow> rows;
  for (size_t bytes : sizes) {
    const size_t n = bytes / sizeof(float);
    const size_t wrong = verify(hooks, buffer, n);
    const double seconds = time_all_reduce(options, hooks, buffer, n);
    if (hooks.ordinal != 0) continue;
    SweepRow row;
    row.bytes = n * sizeof(float);
    row.n_elems = n;
    row.algorithm = hooks.algorithm ? hooks.algorithm(row.bytes) : "";
    row.time_us = seconds * 1e6;
    row.algbw_gbps = static_cast<double>(row.bytes) / seconds * 1e-9;
    row.busbw_gbps = row.algbw_gbps * 2.0 * (hooks.world_size - 1) / hooks.world_size;
    row.wrong = wrong;
    rows.push_back(row);
  }
  if (hooks.allocate && hooks.release) hooks.release(buffer);
  return rows;
}

std::vector<double> measure_memcpy(const std::vector<size_t>& sizes, const SweepOptions& options) {
  const size_t max_bytes = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  std::vector<char> src(max_bytes, 1), dst(max_bytes, 0);
  std::vector<double> result;
  for (size_t bytes : sizes) {
    auto start = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const double once = std::max(1e-9, std::chrono::duration<double>(Clock::now() - start).count());
    const int64_t iterations = std::clamp<int64_t>(
        static_cast<int64_t>(options.repetition_ms * 1e-3 / once), 1, 1'000'000);
    std::vector<double> per_call;
    for (int r = 0; r < options.repetitions; ++r) {
      start = Clock::now();
      for (int64_t i = 0; i < iterations; ++i) {
        std::memcpy(dst.data(), src.data(), bytes);
        asm volatile("" : : "r"(dst.data()) : "memory");  // keep every copy
      }
      per_call.push_back(std::chrono::duration<double>(Clock::now() - start).count() /
                         static_cast<double>(iterations));
    }
    result.push_back(static_cast<double>(bytes) / median(per_call) * 1e-9);
  }
  return result;
}

void print_table(std::FILE* out, const std::vector<SweepRow>& rows, int world_size,
                 const std::string& title) {
  fmt::print(out, "# {} (N = {}, f32 sum, in place, median time)\n", title, world_size);
  fmt::print(out, "{:>12} {:>10} {:>8} {:>11} {:>9} {:>9} {:>6} {:>10}\n", "size(B)", "count",
             "algo", "time(us)", "algbw", "busbw", "wrong", "memcpy");
  fmt::print(out, "{:>12} {:>10} {:>8} {:>11} {:>9} {:>9} {:>6} {:>10}\n", "", "(elems)", "", "",
             "(GB/s)", "(GB/s)", "", "(GB/s)");
  for (const SweepRow& r : rows) {
    fmt::print(out, "{:>12} {:>10} {:>8} {:>11.2f} {:>9.3f} {:>9.3f} {:>6} {:>10.2f}\n", r.bytes,
               r.n_elems, r.algorithm.empty() ? "-" : r.algorithm, r.time_us, r.algbw_gbps,
               r.busbw_gbps, r.wrong, r.memcpy_gbps);
  }
  std::fflush(out);
}

void write_csv(const std::string& path, const std::vector<SweepRow>& rows, int world_size) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) throw std::runtime_error(fmt::format("cannot write {}", path));
  fmt::print(file,
             "world_size,size_bytes,n_elems,algorithm,time_us,algbw_gbps,busbw_gbps,"
             "wrong,memcpy_gbps\n");
  for (const SweepRow& r : rows) {
    fmt::print(file, "{},{},{},{},{:.3f},{:.4f},{:.4f},{},{:.3f}\n", world_size, r.bytes, r.n_elems,
               r.algorithm, r.time_us, r.algbw_gbps, r.busbw_gbps, r.wrong, r.memcpy_gbps);
  }
  std::fclose(file);
}

std::vector<std::string> parse_sweep_args(int argc, char** argv, SweepOptions& options) {
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> size_t {
      if (i + 1 >= argc) throw std::invalid_argument(arg + ": missing value");
      return std::stoull(argv[++i]);
    };
    if (arg == "--min-bytes")
      options.min_bytes = value();
    else if (arg == "--max-bytes")
      options.max_bytes = value();
    else if (arg == "--factor")
      options.factor = value();
    else if (arg == "--repetitions")
      options.repetitions = static_cast<int>(value());
    else
      rest.push_back(arg);
  }
  if (options.factor < 2 || options.min_bytes < 4 || options.repetitions < 1) {
    throw std::invalid_argument("expected --factor >= 2, --min-bytes >= 4, --repetitions >= 1");
  }
  return rest;
}

}  // namespace xs::bench
