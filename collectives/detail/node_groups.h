#pragma once
// The network side of the hierarchical collectives (multi_host_communicator.h): one gloo TCP
// device per process, one gloo context per group this replica belongs to, created on first
// use, and gloo's collectives over a group, whose exceptions come out as xs::PeerFailure or
// xs::Timeout naming the call and the group. A group is a piece's holders, one replica per
// node (node_pieces.h); in gloo the member on node h is rank h.
//
//   detail::NodeGroups groups(topology, store, "10.0.0.2", "job42", 60'000);
//   groups.set_call({"all_reduce", DType::kF32, n_elems});
//   groups.all_reduce(piece.holders, data + piece.offset * 4, piece.count, DType::kF32, op);
//
// Lazy creation cannot deadlock. Creating a group's context (gloo's connectFullMesh through
// the store) is itself a collective among exactly the group's members, like the gloo call
// that follows it on the same piece. Every replica takes its steps in one global order: calls
// in program order; within a call, its phases in a fixed order and its pieces by increasing
// offset; and each step (a local phase, or a piece with its context creation) waits only for
// that step's members. So the earliest unfinished step in that order has all its members at
// it or on their way (their earlier steps are finished) and completes; by induction so do all.
//
// Every wait is bounded by the collective timeout: the context's (gloo's connects, sends and
// receives) and the store's (get() waits at most that long for a key, see DeadlineStore).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "xla_spawn/base/dtype.h"
#include "xla_spawn/collectives/node_topology.h"

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace xs::detail {

// The communicator call a network operation belongs to, for error messages.
struct CallInfo {
  const char* name = "collective";
  std::optional<DType> dtype;  // none for barrier and rendezvous
  size_t n_elems = 0;
  std::string describe() const;  // "all_reduce (f32, 669706 elements)", "barrier"
};

// Hex of a 64-bit hash of a group's holders: the store key prefix of its context (a group
// has one holder per node, so up to kMaxNodes of them).
std::string group_key(std::span<const int> holders);

class NodeGroups {
 public:
  // Throws xs::IoError when gloo cannot open a device on `address` (this node's address as
  // the other nodes reach it).
  NodeGroups(NodeTopology topology, std::shared_ptr<gloo::rendezvous::Store> store,
             const std::string& address, std::string prefix, int64_t timeout_ms);
  ~NodeGroups();
  NodeGroups(const NodeGroups&) = delete;
  NodeGroups& operator=(const NodeGroups&) = delete;

  void set_call(const CallInfo& call) { call_ = call; }
  // Called with the current call as each network operation begins, and with nullptr when it
  // has succeeded (not when it throws): where the hang report learns that this replica is
  // between nodes (ShmCommunicator::network_phase).
  using PhaseHook = std::function<void(const CallInfo*)>;
  void set_phase_hook(PhaseHook hook) { phase_hook_ = std::move(hook); }
  const CallInfo& call() const { return call_; }
  // "all_reduce (f32, 8 elements) across nodes 0-2 (ordinals 1, 3, 4)": where errors happened.
  std::string where(std::span<const int> holders) const;

  // Each runs over the group `holders` (this replica is its member on this node) and is a no-op
  // in a job of one node. In place on `count` elements: afterwards every member holds the
  // reduction (gloo's bcube between two nodes, in slices of at most 16 MiB, its ring among
  // more; both reduce each element on one member and pass the result on, so all get the same
  // bits).
  void all_reduce(std::span<const int> holders, std::byte* data, size_t count, DType dtype,
                  ReduceOp op);
  void broadcast(std::span<const int> holders, std::byte* data, size_t n_bytes, int root_node);
  void barrier(std::span<const int> holders);

  // A piece of a batch: `count` elements at element `offset` of the buffer, owned by node
  // `owner`.
  struct OwnedPiece {
    size_t offset = 0;
    size_t count = 0;
    int owner = 0;
  };
  // The transfers of a whole batch of pieces go in flight at once, so each link carries data
  // both ways at the same time where one piece after the other would use one direction at a
  // time; in 1 MiB chunks, a receiver keeping two per peer posted (refilled round-robin), so
  // no more than that is in flight towards a node. reduce_to_owners: every other member sends its elements of each piece to the owner,
  // which reduces them into its own in node order (0..nnodes-1; `op` without mean's division,
  // so every rerun gets the same bits); the others' `data` is unchanged. send_from_owners:
  // each piece's owner sends its bytes to every other member. Every member passes the same
  // batch.
  void reduce_to_owners(std::span<const int> holders, std::byte* data,
                        std::span<const OwnedPiece> pieces, DType dtype, ReduceOp op);
  void send_from_owners(std::span<const int> holders, std::byte* data,
                        std::span<const OwnedPiece> pieces, size_t elem_bytes);
  // Every member's bytes, by node (sizes are exchanged first).
  std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const int> holders,
                                                       std::span<const std::byte> mine);

  // Hard-closes every context's connections, so members on other nodes fail at once instead
  // of waiting out their timeout. No context is usable afterwards.
  void close_all() noexcept;

  size_t context_count() const { return contexts_.size(); }
  // Wall time spent creating contexts (connectFullMesh), in seconds.
  double connect_seconds() const { return connect_seconds_; }
  // Wall time spent in gloo's operations and context creation, in seconds.
  double network_seconds() const { return network_seconds_; }

 private:
  using Op = std::function<void(const std::shared_ptr<gloo::Context>&)>;
  const std::shared_ptr<gloo::Context>& context(std::span<const int> holders);
  // Runs `op` on the group's context; gloo's exceptions leave as xs::PeerFailure / Timeout.
  void run(std::span<const int> holders, const Op& op);

  NodeTopology topology_;
  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  // The next slot of a group's point-to-point transfers (its members count their batches
  // alike).
  uint64_t next_slot(std::span<const int> holders, size_t n_pieces);

  // Declared before the contexts, so destroyed after them (and their connections):
  std::vector<std::byte> partials_;  // reduce_to_owners' receive buffer
  // A failed transfer's buffers. gloo's loop thread may still signal them (its
  // UnboundBuffer::signalException, when a peer's connection breaks) after the wait that
  // threw, so they go with the contexts, not during the unwind (ThreadSanitizer saw that race).
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> failed_buffers_;
  std::map<std::vector<int>, std::shared_ptr<gloo::Context>> contexts_;
  std::map<std::vector<int>, uint64_t> batches_;  // batches run per group
  CallInfo call_;
  PhaseHook phase_hook_;
  double connect_seconds_ = 0;
  double network_seconds_ = 0;
};

}  // namespace xs::detail
