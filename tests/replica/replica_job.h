#pragma once
// Runs a function in n real replica processes (spawn(fn) forks them with a real segment) and
// collects what they print, by ordinal: the harness of the xm tests.
//
//   const ReplicaJob job = run_replicas(3, [](int ordinal) { ... xm::... ... });
//   EXPECT_EQ(job.result.exit_code, 0) << job.result.summary;

#include <chrono>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>

#include "xla_spawn/launcher/spawn.h"
#include "xla_spawn/replica/xm.h"

namespace xs::testing {

struct ReplicaJob {
  JobResult result;
  std::map<int, std::string> output;
};

inline ReplicaJob run_replicas(int n, const std::function<void(int)>& fn) {
  ReplicaJob job;
  SpawnOptions options;
  options.grace = std::chrono::milliseconds(500);
  options.output.on_line = [&job](int ordinal, ReplicaStream, std::string_view line) {
    job.output[ordinal] += std::string(line) + "\n";
  };
  job.result = spawn(
      [&fn](int ordinal) {
        xm::shutdown();  // state forked from the test process is not this replica's
        xm::init();
        fn(ordinal);
        xm::shutdown();
      },
      n, options);
  return job;
}

// In a replica: throws (the replica exits non-zero, naming `what`) unless ok.
inline void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

}  // namespace xs::testing
