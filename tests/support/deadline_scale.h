#pragma once
// Deadlines in tests, stretched under sanitizers: scripts/sanitize sets XS_TEST_DEADLINE_SCALE
// (ASan+UBSan run the suite ~3x slower, TSan ~5-15x, worst with N replicas > cores), so a
// deadline that is generous for the plain build stays generous when instrumented, without
// making the plain build wait any longer. Unset: 1.
//
//   const JobResult r = job.wait(xs::testing::scaled(std::chrono::seconds(240)));

#include <chrono>
#include <cstdint>

#include "xla_spawn/base/env.h"

namespace xs::testing {

// XS_TEST_DEADLINE_SCALE, an integer factor in [1, 100]; a malformed value throws
// xs::InvalidArgument naming it rather than silently running with the wrong deadlines.
inline int64_t deadline_scale() {
  static const int64_t scale = env_int("XS_TEST_DEADLINE_SCALE", 1, 100).value_or(1);
  return scale;
}

template <typename Rep, typename Period>
std::chrono::milliseconds scaled(std::chrono::duration<Rep, Period> deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline) * deadline_scale();
}

}  // namespace xs::testing
