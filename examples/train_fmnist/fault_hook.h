#pragma once
// Test-only fault injection for the reliability suite (scripts/fault-inject): with
// XLA_SPAWN_TEST_FAULT=<point>@<ordinal>:<step> set, that ordinal SIGKILLs itself at the named
// point of that optimizer step, on attempt 0 only (so a --max-restarts run then completes).
// The signal is real (kill(getpid(), SIGKILL)): no cleanup, no flush, like an OOM kill.
//
//   forward     after the step's forward pass is traced, before backward
//   allreduce   while the in-graph gradient all-reduce (sharded update: reduce-scatter) runs
//               (a thread fires once it started)
//   checkpoint  while the master writes the checkpoint (fires on the temporary's creation)
//   sleep       no signal: the ordinal sleeps (up to 10 min) in the forward pass of that step,
//               as a replica stuck outside any collective would (its peers time out)
//   slow        no signal: the ordinal sleeps <step> milliseconds (at most 1000) in the forward
//               pass of every step, as a straggler would (the launcher's straggler line names it)
//
//   FaultHook hook = FaultHook::from_env(checkpoint_path);   // inactive when unset
//   hook.at_forward(step);  hook.before_save(step);

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace xs::fmnist {

inline constexpr const char* kTestFaultEnv = "XLA_SPAWN_TEST_FAULT";

enum class FaultPoint { kNone, kForward, kAllReduce, kCheckpoint, kSleep, kSlow };

class FaultHook {
 public:
  // Parses XLA_SPAWN_TEST_FAULT (xs::InvalidArgument when malformed). Needs xm::init() done;
  // for the allreduce point it wraps the runtime's communicator.
  static std::unique_ptr<FaultHook> from_env(const std::string& checkpoint_path);
  ~FaultHook();

  // The trainer calls these; each fires only for the configured point, ordinal and step.
  void at_forward(int64_t step);
  void before_save(int64_t step);

  int64_t step() const { return step_.load(); }

 private:
  FaultHook() = default;
  struct Wrapper;

  FaultPoint point_ = FaultPoint::kNone;
  int64_t target_step_ = 0;
  std::string checkpoint_path_;
  std::atomic<int64_t> step_{-1};  // the step being traced/run (read by the all-reduce wrapper)
  std::unique_ptr<Wrapper> wrapper_;
};

}  // namespace xs::fmnist
