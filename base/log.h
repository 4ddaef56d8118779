#pragma once
// Logging for every binary of the project: spdlog to stderr, each line tagged with the
// replica's ordinal (or another tag, e.g. "xla-spawn"), so interleaved output stays readable.
//
//   xs::init_logging(fmt::format("ordinal {}", ctx.ordinal));
//   spdlog::info("epoch {} done", epoch);   // [12:00:01.234] [ordinal 3] [info] epoch 1 done
//
// The level comes from XLA_SPAWN_LOG_LEVEL (trace, debug, info, warn, error, off; default info).

#include <string>

namespace xs {

inline constexpr const char* kLogLevelEnv = "XLA_SPAWN_LOG_LEVEL";

// Replaces spdlog's default logger with one tagged `tag`. Safe to call again (re-tags).
void init_logging(const std::string& tag);
// XLA_SPAWN_LOG_LEVEL's spdlog level (info when unset); InvalidArgument naming it when it is
// none of the levels.
int log_level_from_env();

}  // namespace xs
