#include "replica/context.h"

#include <optional>

#include <fmt/format.h>

#include "base/env.h"
#include "base/error.h"

namespace xs {
namespace {

// Our variable if set, else torchrun's; both set and different is an error.
std::optional<int64_t> read_pair(const char* ours, const char* torch, int64_t min, int64_t max) {
  auto a = env_int(ours, min, max);
  auto b = env_int(torch, min, max);
  if (a && b && *a != *b) {
    throw InvalidArgument(fmt::format("{}={} disagrees with {}={}", ours, *a, torch, *b));
  }
  return a ? a : b;
}

}  // namespace

ReplicaContext ReplicaContext::from_env() {
  namespace n = env_names;
  ReplicaContext ctx;
  const auto world = read_pair(n::kWorldSize, n::kTorchWorldSize, 1, kMaxWorldSize);
  const auto ordinal = read_pair(n::kOrdinal, n::kTorchRank, 0, kMaxWorldSize - 1);
  if (world.has_value() != ordinal.has_value()) {
    throw InvalidArgument(fmt::format(
        "{} and {} (or {} and {}) must be set together; only {} is set", n::kOrdinal,
        n::kWorldSize, n::kTorchRank, n::kTorchWorldSize, world ? "the world size" : "the ordinal"));
  }
  if (!world) return ctx;  // started alone: ordinal 0 of 1

  ctx.world_size = static_cast<int>(*world);
  ctx.ordinal = static_cast<int>(*ordinal);
  if (ctx.ordinal >= ctx.world_size) {
    throw InvalidArgument(fmt::format("{}={} must be less than {}={}", n::kOrdinal, ctx.ordinal,
                                      n::kWorldSize, ctx.world_size));
  }
  ctx.local_world_size = static_cast<int>(
      read_pair(n::kLocalWorldSize, n::kTorchLocalWorldSize, 1, ctx.world_size)
          .value_or(ctx.world_size));
  ctx.local_ordinal = static_cast<int>(
      read_pair(n::kLocalOrdinal, n::kTorchLocalRank, 0, kMaxWorldSize - 1).value_or(ctx.ordinal));
  if (ctx.local_ordinal >= ctx.local_world_size) {
    throw InvalidArgument(fmt::format("{}={} must be less than {}={}", n::kLocalOrdinal,
                                      ctx.local_ordinal, n::kLocalWorldSize, ctx.local_world_size));
  }
  ctx.attempt = static_cast<int>(env_int(n::kAttempt, 0, 1'000'000).value_or(0));
  ctx.job_id = env_string(n::kJobId).value_or(fmt::format("torchrun-{}", ctx.world_size));
  ctx.segment_name = env_string(n::kSegment).value_or("");
  return ctx;
}

}  // namespace xs
