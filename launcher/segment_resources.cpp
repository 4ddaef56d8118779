#include "xla_spawn/launcher/segment_resources.h"

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/io.h"
#include "xla_spawn/replica/context.h"
#include "xla_spawn/shm/segment.h"

namespace xs {

SegmentResources::SegmentResources()
    : staging_bytes_(static_cast<size_t>(
          env_int(kStagingBytesEnv, static_cast<int64_t>(kMinStagingBytes), int64_t{1} << 34)
              .value_or(static_cast<int64_t>(kDefaultStagingBytes)))),
      arena_bytes_(static_cast<size_t>(env_int(kArenaBytesEnv, 0, int64_t{1} << 36)
                                           .value_or(static_cast<int64_t>(kDefaultArenaBytes)))),
      removed_stale_(remove_stale_segments()) {
  for (const std::string& name : removed_stale_) {
    write_all(2, fmt::format("xla-spawn: removed stale segment {} (its launcher is gone)\n", name));
  }
}

std::vector<EnvVar> SegmentResources::prepare(const std::string& job_id, int world_size,
                                              int /*attempt*/) {
  // A restart is a new attempt of the same job: the previous attempt's segment was removed
  // by release(), so the same name is free again and replicas validate the same job id.
  release();
  name_ = create_segment(job_id, world_size, staging_bytes_, arena_bytes_);
  return {{env_names::kSegment, name_}};
}

void SegmentResources::release() noexcept {
  if (name_.empty()) return;
  try {
    remove_segment(name_);
  } catch (...) {
    // Nothing to do: the next start's stale sweep removes it (its launcher pid is dead then).
  }
  name_.clear();
}

}  // namespace xs
