#pragma once
// A small fork harness for tests of shared-memory collectives: creates a job segment, forks
// one child per ordinal that runs a function and _exits (never returning into gtest), waits
// for all of them with a deadline, and reports each child's exit, signal and message.
//
//   xs::testing::ForkJob job(4);
//   job.start([](xs::testing::Child& child) {
//     xs::ShmCommunicator comm = child.communicator();
//     ...; return std::string();                      // "" = success, else what went wrong
//   });
//   const auto result = job.wait(std::chrono::seconds(60));
//   EXPECT_TRUE(result.all_ok()) << result.describe();

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "xla_spawn/collectives/shm_communicator.h"
#include "xla_spawn/shm/segment.h"

namespace xs::testing {

// Shared between the parent and all children of one job (anonymous MAP_SHARED mapping).
inline constexpr size_t kScratchBytes = 64 << 10;

// What a child knows about itself.
struct Child {
  int ordinal = 0;
  int world_size = 0;
  std::string segment_name;
  std::string job_id;
  std::byte* scratch = nullptr;

  Segment attach() const { return Segment::attach(segment_name, ordinal, world_size, job_id); }
  ShmCommunicator communicator(ShmCommunicatorOptions options = {}) const {
    return ShmCommunicator(attach(), options);
  }
};

struct ChildResult {
  int ordinal = 0;
  pid_t pid = 0;
  int exit_code = -1;  // -1 when killed by a signal or never reaped
  int signal = 0;
  std::string message;  // what the child returned, or the exception it threw
  bool ok() const { return exit_code == 0 && signal == 0; }
};

struct JobResult {
  std::vector<ChildResult> children;
  bool timed_out = false;  // the deadline passed; the remaining children were SIGKILLed
  double elapsed_s = 0;
  bool all_ok() const;
  std::string describe() const;
};

// Exit codes of a child: 0 returned "", 1 returned a message, 2 threw, 3 threw non-std.
class ForkJob {
 public:
  // staging_bytes 0: no job-wide segment (segment_name() is empty); the children bring their
  // own, e.g. one per node (multi_host_harness.h).
  explicit ForkJob(int world_size, size_t staging_bytes = kDefaultStagingBytes,
                   size_t arena_bytes = kDefaultArenaBytes);
  ~ForkJob();  // kills and reaps children still running; removes the segment
  ForkJob(const ForkJob&) = delete;
  ForkJob& operator=(const ForkJob&) = delete;

  const std::string& segment_name() const;
  const std::string& job_id() const { return job_id_; }
  std::byte* scratch() const { return scratch_; }
  // Every child's pid, by ordinal (still valid after wait()).
  const std::vector<pid_t>& pids() const { return pids_; }

  void start(const std::function<std::string(Child&)>& fn);
  JobResult wait(std::chrono::milliseconds deadline);

 private:
  int world_size_;
  std::string job_id_;
  std::optional<OwnedSegment> segment_;
  std::byte* scratch_;
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
  std::vector<int> pipes_;  // read ends, one per child
};

// A job id unique to this process and call ("t<pid>-<n>").
std::string unique_job_id();

// Monotonic clock in nanoseconds (comparable across processes).
int64_t monotonic_ns();

}  // namespace xs::testing
