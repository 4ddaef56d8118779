// Hierarchical rendezvous: local rendezvous, an exchange among the leaders (local ordinal 0 of
// every node) over gloo, a local broadcast of the outcome.
#include <cstring>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/detail/hierarchy.h"

namespace xs::detail {
namespace {

// Byte strings in the exchanged blobs: a u64 length, then the bytes.
void put_u64(std::vector<std::byte>& blob, uint64_t value) {
  const auto* bytes = reinterpret_cast<const std::byte*>(&value);
  blob.insert(blob.end(), bytes, bytes + sizeof value);
}
void put_bytes(std::vector<std::byte>& blob, std::span<const std::byte> bytes) {
  put_u64(blob, bytes.size());
  blob.insert(blob.end(), bytes.begin(), bytes.end());
}

// Reads a blob that came from a peer: every length is checked against what is left, and a
// short or overlong blob is an xs::PeerFailure naming `from`.
class BlobReader {
 public:
  BlobReader(std::span<const std::byte> blob, std::string from)
      : rest_(blob), from_(std::move(from)) {}
  uint64_t u64() {
    uint64_t value;
    std::memcpy(&value, take(sizeof value).data(), sizeof value);
    return value;
  }
  std::span<const std::byte> bytes() { return take(u64()); }
  std::string_view text() {
    const std::span<const std::byte> b = bytes();
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }
  // Bytes left over mean the sender packed more payloads than we read: the nodes disagree
  // about the job's shape.
  void expect_end() const {
    if (rest_.empty()) return;
    throw PeerFailure(fmt::format(
        "rendezvous: {} sent {} bytes more than its node's payloads (do the nodes agree on the "
        "replicas per node?)",
        from_, rest_.size()));
  }

 private:
  std::span<const std::byte> take(uint64_t n_bytes) {
    if (n_bytes > rest_.size()) {
      throw PeerFailure(fmt::format("rendezvous: malformed data from {}: {} bytes wanted, {} left",
                                    from_, n_bytes, rest_.size()));
    }
    const std::span<const std::byte> taken = rest_.first(n_bytes);
    rest_ = rest_.subspan(n_bytes);
    return taken;
  }

  std::span<const std::byte> rest_;
  std::string from_;
};

constexpr uint64_t kOutcomePayloads = 0;
constexpr uint64_t kOutcomeMismatch = 1;

// On a leader: exchanges (tag, node's payloads) with the other leaders and returns the
// outcome blob: kOutcomePayloads and every ordinal's payload in ordinal order, or
// kOutcomeMismatch and a message naming the first node whose tag differs from node 0's (the
// same message on every node).
std::vector<std::byte> leaders_outcome(const Hierarchy& h, const std::string& tag,
                                       const std::vector<std::vector<std::byte>>& node_payloads) {
  const NodeTopology& t = h.topology;
  std::vector<std::byte> mine;
  put_bytes(mine, std::as_bytes(std::span(tag)));
  for (const std::vector<std::byte>& p : node_payloads) put_bytes(mine, p);
  const std::vector<int> leaders(static_cast<size_t>(t.nnodes()), 0);
  const std::vector<std::vector<std::byte>> blobs = h.groups.all_gather_bytes(leaders, mine);
  std::vector<BlobReader> readers;
  for (int node = 0; node < t.nnodes(); ++node) {
    readers.emplace_back(blobs[node], fmt::format("the leader of node {}", node));
  }
  std::vector<std::byte> outcome;
  std::vector<std::string_view> tags;
  for (BlobReader& r : readers) tags.push_back(r.text());
  for (int node = 1; node < t.nnodes(); ++node) {
    if (tags[node] == tags[0]) continue;
    put_u64(outcome, kOutcomeMismatch);
    const std::string message = fmt::format(
        "rendezvous: node 0 passed tag '{}', node {} passed tag '{}'", tags[0], node, tags[node]);
    put_bytes(outcome, std::as_bytes(std::span(message)));
    return outcome;
  }
  put_u64(outcome, kOutcomePayloads);
  for (int node = 0; node < t.nnodes(); ++node) {
    for (int l = 0; l < t.node_size(node); ++l) put_bytes(outcome, readers[node].bytes());
    readers[node].expect_end();
  }
  return outcome;
}

RendezvousResult decode_outcome(std::span<const std::byte> outcome, int world_size) {
  BlobReader reader(outcome, "this node's leader");
  RendezvousResult result;
  if (reader.u64() == kOutcomeMismatch) {
    result.mismatch = reader.text();
    return result;
  }
  result.payloads.resize(static_cast<size_t>(world_size));
  for (std::vector<std::byte>& p : result.payloads) {
    const std::span<const std::byte> bytes = reader.bytes();
    p.assign(bytes.begin(), bytes.end());
  }
  return result;
}

}  // namespace

// Hierarchical rendezvous schedule. A local rendezvous gives every replica its node's
// payloads (and checks the tag within the node). The leaders, local ordinal 0 of every node
// (one group), exchange (tag, their node's payloads) with gloo's all-gather of the sizes, then
// of the bytes, and each compares every node's tag with node 0's. Each leader broadcasts the
// outcome inside its node, its size, then its bytes; every replica decodes the same outcome.
RendezvousResult multi_host_rendezvous(const Hierarchy& h, const std::string& tag,
                                       std::span<const std::byte> payload) {
  std::vector<std::vector<std::byte>> node_payloads = {{payload.begin(), payload.end()}};
  h.locally([&](ShmCommunicator& local) { node_payloads = local.rendezvous(tag, payload); });
  std::vector<std::byte> outcome;
  if (h.topology.local_ordinal() == 0) outcome = leaders_outcome(h, tag, node_payloads);
  int64_t outcome_bytes = static_cast<int64_t>(outcome.size());
  h.locally([&](ShmCommunicator& local) {
    local.broadcast(&outcome_bytes, 1, DType::kI64, 0);
    outcome.resize(static_cast<size_t>(outcome_bytes));
    local.broadcast(outcome.data(), outcome.size(), DType::kBool, 0);  // kBool: one byte each
  });
  return decode_outcome(outcome, h.topology.world_size());
}

}  // namespace xs::detail
