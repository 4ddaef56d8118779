#pragma once
// The all-reduce sweep in nccl-tests form, shared by our benchmark and the MPI one: sizes
// from min to max bytes by a factor, f32 sum in place; per size the median time over
// repetitions, algbw = bytes / time, busbw = algbw * 2(n-1)/n, and the wrong elements of a
// verification run (inputs whose sum is exact in any order) made before timing.
//
//   xs::bench::SweepHooks hooks{ordinal, world_size, all_reduce, barrier, broadcast_i64, algo};
//   auto rows = xs::bench::run_sweep(options, hooks);   // rows on ordinal 0, empty elsewhere
//   xs::bench::print_table(stdout, rows, world_size); xs::bench::write_csv(path, rows, n);

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace xs::bench {

struct SweepOptions {
  size_t min_bytes = 8;
  size_t max_bytes = size_t{256} << 20;
  size_t factor = 4;
  int repetitions = 7;        // median over these
  double repetition_ms = 20;  // iterations per repetition are chosen to last about this long
};

struct SweepHooks {
  int ordinal = 0;
  int world_size = 1;
  std::function<void(float* data, size_t n_elems)> all_reduce;  // f32 sum, in place
  std::function<void()> barrier;
  std::function<int64_t(int64_t)> broadcast_from_0;    // every ordinal gets ordinal 0's value
  std::function<std::string(size_t bytes)> algorithm;  // what runs at this size
  // The operand buffer (for all sizes); unset: a std::vector. Ours passes
  // Communicator::alloc_buffer, as nccl-tests use registered buffers.
  std::function<float*(size_t n_elems)> allocate;
  std::function<void(float*)> release;
};

struct SweepRow {
  size_t bytes = 0;
  size_t n_elems = 0;
  std::string algorithm;
  double time_us = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  size_t wrong = 0;
  double memcpy_gbps = 0;  // 0 when not measured
};

// The median (the mean of the middle two for an even count); values must not be empty.
double median(std::vector<double> values);
// CPU time of this process, every thread, user + system (CLOCK_PROCESS_CPUTIME_ID), seconds.
double process_cpu_seconds();

std::vector<size_t> sweep_sizes(const SweepOptions& options);

// Runs on every ordinal (all must call it); returns the rows on ordinal 0.
std::vector<SweepRow> run_sweep(const SweepOptions& options, const SweepHooks& hooks);

// Single-process memcpy bandwidth (GB/s, bytes copied / time) of each size, median.
std::vector<double> measure_memcpy(const std::vector<size_t>& sizes, const SweepOptions& options);

void print_table(std::FILE* out, const std::vector<SweepRow>& rows, int world_size,
                 const std::string& title);
void write_csv(const std::string& path, const std::vector<SweepRow>& rows, int world_size);

// Parses "--name value" pairs shared by the sweep binaries into options; returns leftovers.
std::vector<std::string> parse_sweep_args(int argc, char** argv, SweepOptions& options);

}  // namespace xs::bench
