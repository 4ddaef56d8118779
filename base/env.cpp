#include "xla_spawn/base/env.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"

namespace xs {

std::optional<std::string> env_string(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int64_t parse_int(std::string_view text, int64_t min, int64_t max, std::string_view what) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != end) {
    throw InvalidArgument(
        fmt::format("{}='{}': expected an integer in [{}, {}]", what, text, min, max));
  }
  if (ec == std::errc::result_out_of_range || value < min || value > max) {
    throw InvalidArgument(
        fmt::format("{}='{}': out of range, expected an integer in [{}, {}]", what, text, min, max));
  }
  return value;
}

std::optional<int64_t> env_int(const char* name, int64_t min, int64_t max) {
  auto text = env_string(name);
  if (!text) return std::nullopt;
  return parse_int(*text, min, max, name);
}

std::optional<bool> env_bool(const char* name) {
  auto text = env_string(name);
  if (!text) return std::nullopt;
  std::string lower = *text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "0" || lower == "false" || lower == "no" || lower == "off") return false;
  throw InvalidArgument(
      fmt::format("{}='{}': expected a boolean (1/0, true/false, yes/no, on/off)", name, *text));
}

}  // namespace xs
