#pragma once
// xmp.spawn for C++: forks the calling program N times and runs fn(ordinal) in each child,
// under the same supervisor as xla-spawn (tagged output, fail-fast, grace, timeout). Each
// child gets the replica environment, so ReplicaContext::from_env() works inside fn.
//
//   xs::JobResult r = xs::spawn([](int ordinal) { run_replica(ordinal); }, 4);
//   EXPECT_EQ(r.exit_code, 0) << r.summary;
//
// A child exits 0 when fn returns and 1 when it throws (what() goes to its stderr, so it is
// in the summary). Children never return into the caller: no atexit handlers, no gtest
// teardown. Call it from a single-threaded point of the program: fork copies only the
// calling thread, and the parent-death signal follows the forking thread.

#include <chrono>
#include <functional>

#include "xla_spawn/launcher/supervisor.h"

namespace xs {

// SupervisorOptions with a default job timeout: an in-process job (often a test) must not
// hang forever when a replica deadlocks.
struct SpawnOptions : SupervisorOptions {
  SpawnOptions() { timeout = std::chrono::seconds(120); }
};

JobResult spawn(const std::function<void(int ordinal)>& fn, int nprocs,
                const SpawnOptions& options = SpawnOptions());

}  // namespace xs
