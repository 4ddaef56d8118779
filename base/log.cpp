#include "xla_spawn/base/log.h"

#include <memory>
#include <optional>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"

namespace xs {

int log_level_from_env() {
  const std::optional<std::string> text = env_string(kLogLevelEnv);
  if (!text) return spdlog::level::info;
  const spdlog::level::level_enum level = spdlog::level::from_str(*text);
  // from_str maps anything unknown to "off"; only accept that when it was asked for.
  if (level == spdlog::level::off && *text != "off") {
    throw InvalidArgument(
        fmt::format("{}='{}': expected one of trace, debug, info, warn, error, critical, off",
                    kLogLevelEnv, *text));
  }
  return level;
}

void init_logging(const std::string& tag) {
  const auto level = static_cast<spdlog::level::level_enum>(log_level_from_env());
  auto logger = std::make_shared<spdlog::logger>(
      tag, std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern("[%H:%M:%S.%e] [%n] [%l] %v");
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace xs
