#pragma once
// The job's shared-memory segment as a JobResources: created before each attempt's fork
// (its name reaches every replica as XLA_SPAWN_SEGMENT) and removed after the attempt and on
// every exit path of the supervisor. Construction sweeps segments left by dead launchers.
//
//   xs::SegmentResources segment;              // removes stale segments, logs their names
//   options.resources = &segment;
//   xs::supervise(n, body, options);

#include <cstddef>
#include <string>
#include <vector>

#include "xla_spawn/launcher/job_resources.h"

namespace xs {

// Overrides the per-ordinal staging size of the segment (bytes).
inline constexpr const char* kStagingBytesEnv = "XLA_SPAWN_STAGING_BYTES";
// Overrides the per-ordinal buffer arena size (bytes; Communicator::alloc_buffer, 0 = none).
inline constexpr const char* kArenaBytesEnv = "XLA_SPAWN_ARENA_BYTES";

class SegmentResources final : public JobResources {
 public:
  SegmentResources();
  ~SegmentResources() override { release(); }
  SegmentResources(const SegmentResources&) = delete;
  SegmentResources& operator=(const SegmentResources&) = delete;

  std::vector<EnvVar> prepare(const std::string& job_id, int world_size, int attempt) override;
  void release() noexcept override;

  // Names of the stale segments the constructor removed.
  const std::vector<std::string>& removed_stale() const { return removed_stale_; }

 private:
  size_t staging_bytes_;
  size_t arena_bytes_;
  std::string name_;  // empty while no segment exists
  std::vector<std::string> removed_stale_;
};

}  // namespace xs
