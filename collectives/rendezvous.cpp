// Rendezvous: a tagged exchange of small byte payloads.
#include <cstring>

#include <fmt/format.h>

#include "base/error.h"
#include "collectives/detail/schedules.h"

namespace xs::detail {
namespace {

// Layout in the staging half: u64 tag length, u64 payload length, tag bytes, payload bytes.
constexpr size_t kLengthsBytes = 2 * sizeof(uint64_t);

std::string_view tag_of(const std::byte* area) {
  uint64_t tag_bytes;
  std::memcpy(&tag_bytes, area, sizeof tag_bytes);
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
  std::vector<std::vector<std::byte>> payloads(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    const std::byte* area = rounds.staging(j, parity);
    if (tag_of(area) != tag) {
      throw PeerFailure(
          fmt::format("rendezvous: ordinal {} passed tag '{}', ordinal {} passed "
                      "tag '{}'",
                      me, tag, j, tag_of(area)));
    }
    uint64_t payload_bytes;
    std::memcpy(&payload_bytes, area + sizeof(uint64_t), sizeof payload_bytes);
    const std::byte* begin = area + kLengthsBytes + tag.size();
    payloads[j].assign(begin, begin + payload_bytes);
  }
  return payloads;
}

}  // namespace xs::detail
