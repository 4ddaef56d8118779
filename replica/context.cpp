#include "xla_spawn/replica/context.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"

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

// The name a value read by read_pair came from, for messages: ours if set, else torchrun's.
const char* set_name(const char* ours, const char* torch) {
  return env_string(ours) ? ours : torch;
}

// "2,2,1" -> {2, 2, 1}; InvalidArgument naming the variable for anything else.
std::vector<int> parse_node_sizes(const std::string& text) {
  std::vector<int> sizes;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    sizes.push_back(static_cast<int>(parse_int(std::string_view(text).substr(at, comma - at), 1,
                                               kMaxLocalWorldSize, env_names::kNodeSizes)));
    if (sizes.size() > static_cast<size_t>(kMaxNodes)) {
      throw InvalidArgument(fmt::format("{}: more than {} nodes", env_names::kNodeSizes, kMaxNodes));
    }
    at = comma + 1;
  }
  return sizes;
}

// The node fields of a multi-node job, checked against the ordinals read before.
void read_nodes(ReplicaContext& ctx) {
  namespace n = env_names;
  ctx.nnodes = static_cast<int>(env_int(n::kNnodes, 1, kMaxNodes).value_or(1));
  ctx.node = static_cast<int>(env_int(n::kNode, 0, kMaxNodes - 1).value_or(0));
  if (ctx.node >= ctx.nnodes) {
    throw InvalidArgument(
        fmt::format("{}={} must be less than {}={}", n::kNode, ctx.node, n::kNnodes, ctx.nnodes));
  }
  if (!ctx.multi_node()) return;
  const auto need = [](const char* name) {
    auto value = env_string(name);
    if (!value) throw InvalidArgument(fmt::format("{} is unset in a multi-node job", name));
    return *value;
  };
  ctx.node_sizes = parse_node_sizes(need(n::kNodeSizes));
  ctx.master_addr = need(n::kMasterAddr);
  ctx.master_port = static_cast<int>(parse_int(need(n::kMasterPort), 1, 65535, n::kMasterPort));
  ctx.host_addr = need(n::kHostAddr);
  // The count first: the sums below index node_sizes up to the node.
  const bool counted = static_cast<int>(ctx.node_sizes.size()) == ctx.nnodes;
  int first = 0;
  int total = 0;
  for (size_t k = 0; counted && k < ctx.node_sizes.size(); ++k) {
    if (static_cast<int>(k) < ctx.node) first += ctx.node_sizes[k];
    total += ctx.node_sizes[k];
  }
  if (!counted || total != ctx.world_size ||
      ctx.node_sizes[static_cast<size_t>(ctx.node)] != ctx.local_world_size ||
      first + ctx.local_ordinal != ctx.ordinal) {
    throw InvalidArgument(fmt::format(
        "{}={} does not fit {}={}, {}={}, ordinal {} = local ordinal {} of {} on node {}",
        n::kNodeSizes, need(n::kNodeSizes), n::kNnodes, ctx.nnodes, n::kWorldSize, ctx.world_size,
        ctx.ordinal, ctx.local_ordinal, ctx.local_world_size, ctx.node));
  }
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
    throw InvalidArgument(fmt::format("{}={} must be less than {}={}",
                                      set_name(n::kOrdinal, n::kTorchRank), ctx.ordinal,
                                      set_name(n::kWorldSize, n::kTorchWorldSize), ctx.world_size));
  }
  ctx.local_world_size = static_cast<int>(
      read_pair(n::kLocalWorldSize, n::kTorchLocalWorldSize, 1,
                std::min(ctx.world_size, kMaxLocalWorldSize))
          .value_or(ctx.world_size));
  ctx.local_ordinal = static_cast<int>(
      read_pair(n::kLocalOrdinal, n::kTorchLocalRank, 0, kMaxLocalWorldSize - 1)
          .value_or(ctx.ordinal));
  if (ctx.local_world_size > kMaxLocalWorldSize) {
    throw InvalidArgument(fmt::format("{}={}: one node runs at most {} replicas (set {} for a job "
                                      "of several nodes)",
                                      n::kWorldSize, ctx.world_size, kMaxLocalWorldSize,
                                      n::kLocalWorldSize));
  }
  if (ctx.local_ordinal >= ctx.local_world_size) {
    throw InvalidArgument(fmt::format(
        "{}={} must be less than {}={}", set_name(n::kLocalOrdinal, n::kTorchLocalRank),
        ctx.local_ordinal,
        env_string(n::kLocalWorldSize) || env_string(n::kTorchLocalWorldSize)
            ? set_name(n::kLocalWorldSize, n::kTorchLocalWorldSize)
            : "the local world size (the world size when unset)",
        ctx.local_world_size));
  }
  ctx.attempt = static_cast<int>(env_int(n::kAttempt, 0, 1'000'000).value_or(0));
  ctx.job_id = env_string(n::kJobId).value_or(fmt::format("torchrun-{}", ctx.world_size));
  ctx.segment_name = env_string(n::kSegment).value_or("");
  read_nodes(ctx);
  return ctx;
}


}  // namespace xs
