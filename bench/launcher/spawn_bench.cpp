// How long spawn(fn) takes to fork N replicas of the calling program, run an empty fn in
// each and reap them: the floor under every multi-process test that uses spawn.
//
//   build/bench/launcher/spawn_bench --benchmark_filter=BM_SpawnNoop

#include <cstdio>
#include <string_view>

#include <benchmark/benchmark.h>

#include "xla_spawn/launcher/spawn.h"

namespace {

void BM_SpawnNoop(benchmark::State& state) {
  const int nprocs = static_cast<int>(state.range(0));
  xs::SpawnOptions options;
  options.output.shown.assign(static_cast<size_t>(nprocs), false);  // keep the console clean
  // Verify once before timing: every replica ran and the job succeeded.
  int lines = 0;
  options.output.on_line = [&lines](int, xs::ReplicaStream, std::string_view) { ++lines; };
  const xs::JobResult check =
      xs::spawn([](int ordinal) { std::printf("%d\n", ordinal); }, nprocs, options);
  if (check.exit_code != 0 || lines != nprocs) {
    state.SkipWithError("spawn check failed");
    return;
  }
  options.output.on_line = nullptr;
  for (auto _ : state) {
    const xs::JobResult r = xs::spawn([](int) {}, nprocs, options);
    benchmark::DoNotOptimize(r.exit_code);
  }
  state.counters["replicas_per_s"] = benchmark::Counter(
      static_cast<double>(nprocs * state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SpawnNoop)
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
