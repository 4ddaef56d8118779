// Rendezvous: a tagged exchange of small byte payloads.
#include <cstring>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/detail/schedules.h"

namespace xs::detail {
namespace {

// Layout in the staging half: u64 tag length, u64 payload length, tag bytes, payload bytes.
constexpr size_t kLengthsBytes = 2 * sizeof(uint64_t);

// The lengths come from a peer's staging: a scribbling or corrupt peer must not make us read
// past the half, so each length is checked against what the half can hold.
uint64_t length_at(const std::byte* area, size_t index, size_t capacity, int peer) {
  uint64_t n_bytes;
  std::memcpy(&n_bytes, area + index * sizeof(uint64_t), sizeof n_bytes);
  if (n_bytes > capacity) {
    throw PeerFailure(fmt::format("rendezvous: ordinal {} published a {} of {} bytes; at most {} "
                                  "fit the staging (corrupt segment?)",
                                  peer, index == 0 ? "tag" : "payload", n_bytes, capacity));
  }
  return n_bytes;
}

std::string_view tag_of(const std::byte* area, size_t capacity, int peer) {
  const uint64_t tag_bytes = length_at(area, 0, capacity, peer);
  return {reinterpret_cast<const char*>(area + kLengthsBytes), tag_bytes};
}

}  // namespace

// Rendezvous schedule. Every ordinal writes its tag and payload into its staging half,
// one sync() publishes them; each ordinal checks every tag against its own (a difference
// is an error naming both ordinals and tags) and copies all payloads out.
std::vector<std::vector<std::byte>> rendezvous(Rounds& rounds, const std::string& tag,
                                               std::span<const std::byte> payload) {
  const int n = rounds.world_size();
  const int me = rounds.ordinal();
  const int parity = rounds.next_parity();
  std::byte* mine = rounds.staging(me, parity);
  const uint64_t lengths[2] = {tag.size(), payload.size()};
  std::memcpy(mine, lengths, sizeof lengths);
  std::memcpy(mine + kLengthsBytes, tag.data(), tag.size());
  if (!payload.empty()) {
    std::memcpy(mine + kLengthsBytes + tag.size(), payload.data(), payload.size());
  }
  rounds.sync();
  const size_t capacity = rounds.half_bytes() - kLengthsBytes;
  std::vector<std::vector<std::byte>> payloads(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    const std::byte* area = rounds.staging(j, parity);
    if (tag_of(area, capacity, j) != tag) {
      throw PeerFailure(
          fmt::format("rendezvous: ordinal {} passed tag '{}', ordinal {} passed "
                      "tag '{}'",
                      me, tag, j, tag_of(area, capacity, j)));
    }
    // The tag matched ours, so it is tag.size() bytes; the payload gets what is left.
    const uint64_t payload_bytes = length_at(area, 1, capacity - tag.size(), j);
    const std::byte* begin = area + kLengthsBytes + tag.size();
    payloads[j].assign(begin, begin + payload_bytes);
  }
  return payloads;
}

}  // namespace xs::detail
