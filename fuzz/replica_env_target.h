#pragma once
// The fuzz target for the launcher -> replica environment contract: ReplicaContext::from_env
// (replica/context.h) and base/env.h's parse_int and env_bool, which it is built on. Shared
// by the libFuzzer entry point (fuzz/replica_env_fuzz.cpp) and the CTest corpus replay
// (tests/fuzz/cli_corpus_test.cpp). The input holds the values of kEnvVars in order, NUL
// separated; a missing or empty value leaves the variable unset. Parsing must succeed with a
// consistent context or throw xs::InvalidArgument; parse_int and env_bool must agree with
// the independent reference parsers below.
//
//   bool accepted = xs::fuzz::replica_env_one_input(data, size);  // throws only on a bug

#include <stdlib.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "fuzz/spawn_options_target.h"  // split_at_nul, require
#include "xla_spawn/replica/context.h"

namespace xs::fuzz {

// New variables go at the end, so older corpus files keep their meaning.
inline constexpr std::array<const char*, 17> kEnvVars = {
    env_names::kWorldSize,       env_names::kOrdinal,    env_names::kLocalWorldSize,
    env_names::kLocalOrdinal,    env_names::kAttempt,    env_names::kJobId,
    env_names::kSegment,         env_names::kTorchWorldSize, env_names::kTorchRank,
    env_names::kTorchLocalWorldSize, env_names::kTorchLocalRank, env_names::kNode,
    env_names::kNnodes,          env_names::kNodeSizes,  env_names::kMasterAddr,
    env_names::kMasterPort,      env_names::kHostAddr};

// A decimal integer as the contract defines it: optional '-', then 1+ digits, nothing else;
// nullopt when malformed or outside int64_t. Written without from_chars on purpose.
inline std::optional<int64_t> reference_int(std::string_view text) {
  const bool negative = !text.empty() && text[0] == '-';
  const std::string_view digits = text.substr(negative ? 1 : 0);
  if (digits.empty()) return std::nullopt;
  __int128 value = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
    if (value > (__int128{1} << 63)) return std::nullopt;
  }
  if (negative) value = -value;
  if (value > INT64_MAX) return std::nullopt;
  return static_cast<int64_t>(value);
}

inline void check_parse_int(const std::string& text, int64_t min, int64_t max) {
  const std::optional<int64_t> want = reference_int(text);
  const bool in_range = want && *want >= min && *want <= max;
  try {
    const int64_t got = parse_int(text, min, max, "fuzz");
    require(in_range && got == *want, "parse_int accepted what the reference rejects");
  } catch (const InvalidArgument&) {
    require(!in_range, "parse_int rejected a valid integer");
  }
}

inline void check_env_bool(const char* name, const std::string& text) {
  std::string lower;
  for (const char c : text) lower.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c);
  const bool yes = lower == "1" || lower == "true" || lower == "yes" || lower == "on";
  const bool no = lower == "0" || lower == "false" || lower == "no" || lower == "off";
  try {
    const std::optional<bool> got = env_bool(name);
    require(text.empty() ? !got : (got && *got == yes && (yes || no)),
            "env_bool disagrees with the reference");
  } catch (const InvalidArgument&) {
    require(!text.empty() && !yes && !no, "env_bool rejected a valid boolean");
  }
}

inline void check_context(const ReplicaContext& c, const std::vector<std::string>& values) {
  require(c.world_size >= 1 && c.world_size <= kMaxWorldSize, "context: world size out of range");
  require(c.ordinal >= 0 && c.ordinal < c.world_size, "context: ordinal outside the world");
  require(c.local_world_size >= 1 && c.local_world_size <= c.world_size,
          "context: local world size out of range");
  require(c.local_ordinal >= 0 && c.local_ordinal < c.local_world_size,
          "context: local ordinal outside the local world");
  require(c.attempt >= 0, "context: negative attempt");
  require(c.local_world_size <= kMaxLocalWorldSize, "context: local world size above the limit");
  require(c.node >= 0 && c.node < c.nnodes, "context: node outside the job's nodes");
  if (c.multi_node()) {
    int first = 0;
    int total = 0;
    for (size_t k = 0; k < c.node_sizes.size(); ++k) {
      if (static_cast<int>(k) < c.node) first += c.node_sizes[k];
      total += c.node_sizes[k];
    }
    require(static_cast<int>(c.node_sizes.size()) == c.nnodes && total == c.world_size &&
                first + c.local_ordinal == c.ordinal &&
                c.node_sizes[static_cast<size_t>(c.node)] == c.local_world_size,
            "context: node sizes inconsistent with the ordinals");
    require(!c.master_addr.empty() && c.master_port >= 1 && c.master_port <= 65535 &&
                !c.host_addr.empty(),
            "context: a multi-node job without its master or host address");
  }
  // World size as set by whichever variable is present (ours wins; they must agree).
  const std::string& world = values[0].empty() ? values[7] : values[0];
  require(world.empty() ? c.standalone() && c.world_size == 1
                        : reference_int(world) == c.world_size,
          "context: world size differs from the environment");
}

inline bool replica_env_one_input(const uint8_t* data, size_t size) {
  std::vector<std::string> values = split_at_nul(data, size, kEnvVars.size());
  values.resize(kEnvVars.size());
  for (size_t i = 0; i < kEnvVars.size(); ++i) {
    // A value is a C string: setenv stops at NUL, which split_at_nul already removed.
    if (values[i].empty()) {
      ::unsetenv(kEnvVars[i]);
    } else {
      ::setenv(kEnvVars[i], values[i].c_str(), 1);
    }
  }
  for (const std::string& v : values) {
    check_parse_int(v, 0, kMaxWorldSize - 1);
    check_parse_int(v, INT64_MIN, INT64_MAX);
  }
  check_env_bool(kEnvVars[5], values[5]);
  ReplicaContext context;
  try {
    context = ReplicaContext::from_env();
  } catch (const InvalidArgument&) {
    return false;  // rejected with a message naming the variable
  }
  check_context(context, values);
  return true;
}

}  // namespace xs::fuzz
