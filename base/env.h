#pragma once
// Reading configuration from environment variables, validated where it enters.
//
//   auto timeout_ms = xs::env_int("XLA_SPAWN_TIMEOUT_MS", 1, 86'400'000).value_or(60'000);
//
// A malformed value throws xs::InvalidArgument naming the variable, its value and the
// expected range; an unset (or empty) variable is std::nullopt.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace xs {

// The variable's value, or nullopt when it is unset or empty.
std::optional<std::string> env_string(const char* name);

// The variable as an integer in [min, max], or nullopt when unset or empty.
std::optional<int64_t> env_int(const char* name, int64_t min, int64_t max);

// The variable as a boolean: 1/true/yes/on or 0/false/no/off; nullopt when unset or empty.
std::optional<bool> env_bool(const char* name);

// Parses a whole decimal integer in [min, max]; `what` names the source in the error
// ("--nprocs", "XLA_SPAWN_ORDINAL").
int64_t parse_int(std::string_view text, int64_t min, int64_t max, std::string_view what);

}  // namespace xs
