#include "xla_spawn/launcher/spawn.h"

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <iostream>
#include <optional>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/trace.h"
#include "xla_spawn/launcher/segment_monitor.h"
#include "xla_spawn/launcher/segment_resources.h"

namespace xs {
namespace {

// The child's whole life after the supervisor's setup: run fn, flush, _exit.
[[noreturn]] void run_child(const std::function<void(int)>& fn, int ordinal) {
  int code = 0;
  try {
    fn(ordinal);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spawn: ordinal %d threw: %s\n", ordinal, e.what());
    code = 1;
  } catch (...) {
    std::fprintf(stderr, "spawn: ordinal %d threw a non-std::exception\n", ordinal);
    code = 1;
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  trace::flush();  // _exit skips the exit hook that writes the last spans
  ::_exit(code);
}

}  // namespace

JobResult spawn(const std::function<void(int ordinal)>& fn, int nprocs,
                const SpawnOptions& options) {
  // Like xla-spawn, the job gets its shared-memory segment unless the caller brings its own.
  std::optional<SegmentResources> segment;
  std::optional<SegmentMonitor> monitor;  // validates its control block while the job runs
  SpawnOptions with_segment = options;
  if (!with_segment.trace_file) with_segment.trace_file = env_string(trace::kFileEnv);
  if (with_segment.resources == nullptr) {
    with_segment.resources = &monitor.emplace(&segment.emplace());
    if (with_segment.monitor == nullptr) with_segment.monitor = &*monitor;
  }
  return supervise(
      nprocs, [&fn](int ordinal) { run_child(fn, ordinal); }, with_segment);
}

}  // namespace xs
