#pragma once
// The launcher's watch over the job's segment: after the inner resources create it, the
// monitor maps it read-only, records the header, and on every check() validates the control
// block and slots (shm/control_block_check.h) against it and the replicas' real pids. The
// supervisor calls check() a few times a second and stops the job when it reports garbage, so
// a replica that scribbles over shared memory fails the job with a clear error.
//
//   xs::SegmentResources segment;
//   xs::SegmentMonitor monitor(&segment);
//   options.resources = &monitor;  options.monitor = &monitor;

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "xla_spawn/launcher/job_resources.h"
#include "xla_spawn/launcher/supervisor.h"

namespace xs {

class SegmentMonitor final : public JobResources, public JobMonitor {
 public:
  explicit SegmentMonitor(JobResources* inner);  // not owned
  ~SegmentMonitor() override;

  std::vector<EnvVar> prepare(const std::string& job_id, int world_size, int attempt) override;
  void release() noexcept override;
  std::optional<std::string> check(std::span<const pid_t> pids_by_ordinal) noexcept override;
  std::string call_report(std::span<const pid_t> pids_by_ordinal, int first_ordinal,
                          bool spans_nodes) noexcept override;
  std::string straggler_report(int first_ordinal, bool spans_nodes) noexcept override;
  bool timed_out() noexcept override;
  double longest_wait_s() noexcept override;
  std::optional<std::pair<int, std::string>> waits_for_departed(
      std::span<const pid_t> pids_by_ordinal, std::span<const int> ended, double min_wait_s,
      int first_ordinal) noexcept override;
  int request_stacks(std::span<const pid_t> pids_by_ordinal, bool continue_stopped) noexcept override;

 private:
  struct Mapping;
  JobResources* inner_;
  std::unique_ptr<Mapping> mapping_;  // null while no segment exists
};

}  // namespace xs
