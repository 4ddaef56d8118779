#include "xla_spawn/replica/divergence_check.h"

#include <cmath>
#include <cstring>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/replica/xm_collectives.h"
#include "xla_spawn/runtime/runtime.h"
#include "xla_spawn/runtime/state_dict.h"

namespace xs::xm {
namespace {

std::vector<uint64_t> decode(const std::vector<std::byte>& payload) {
  std::vector<uint64_t> words(payload.size() / sizeof(uint64_t));
  std::memcpy(words.data(), payload.data(), words.size() * sizeof(uint64_t));
  return words;
}

// Describes how `theirs` (ordinal k) differs from `ours` (ordinal 0), or "" if it does not.
std::string difference(const std::vector<uint64_t>& master, const std::vector<uint64_t>& theirs,
                       const NamedTensors& params) {
  if (theirs.size() != master.size()) {
    return fmt::format("sent {} hashes, ordinal 0 sent {}", theirs.size(), master.size());
  }
  if (theirs[0] != master[0]) {
    return fmt::format("ran graph {:016x}, ordinal 0 ran graph {:016x}", theirs[0], master[0]);
  }
  for (size_t i = 1; i < master.size(); ++i) {
    if (theirs[i] != master[i]) {
      return fmt::format("parameter '{}' hashes to {:016x}, ordinal 0's to {:016x}",
                         params[i - 1].first, theirs[i], master[i]);
    }
  }
  return "";
}

}  // namespace

uint64_t hash_bytes(std::span<const uint8_t> bytes, uint64_t seed) {
  uint64_t h = seed;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;  // FNV-1a 64-bit prime
  return h;
}

std::vector<uint64_t> parameter_hashes(const NamedTensors& params) {
  std::vector<uint64_t> hashes;
  for (const HostTensorData& t : to_state_dict(params)) hashes.push_back(hash_bytes(t.bytes));
  return hashes;
}

void check_replicas_identical(const NamedTensors& params, int64_t step) {
  std::vector<uint64_t> mine{runtime().last_graph_hash()};
  for (uint64_t h : parameter_hashes(params)) mine.push_back(h);
  const auto all = rendezvous(fmt::format("xm.debug_replicas.step{}", step),
                              std::as_bytes(std::span<const uint64_t>(mine)));
  const std::vector<uint64_t> master = decode(all.at(0));
  for (size_t k = 1; k < all.size(); ++k) {
    const std::string diff = difference(master, decode(all[k]), params);
    if (!diff.empty()) {
      throw PeerFailure(fmt::format("replicas diverged at step {}: ordinal {} {}", step, k, diff));
    }
  }
  spdlog::debug("step {}: graph and {} parameters identical on {} replicas", step, params.size(),
                all.size());
}

void check_finite_loss(double loss, int64_t step) {
  if (std::isfinite(loss)) return;
  throw Error(fmt::format(
      "step {}: the loss is {} on ordinal {}: the run diverged (a learning rate too high?) or a parameter "
      "buffer was overwritten; XLA_SPAWN_DEBUG_REPLICAS=1 compares the replicas' parameters every step",
      step, std::isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf", ordinal()));  // a NaN's sign means nothing
}

}  // namespace xs::xm
