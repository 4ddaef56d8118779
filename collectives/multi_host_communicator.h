#pragma once
// The Communicator of a replica in a job that spans several nodes (hosts): hierarchical
// collectives, shared memory inside a node (ShmCommunicator) and gloo's TCP transport between
// nodes, bit-identical on every replica of the job, for nodes with any replica counts.
//
//   xs::NodeTopology topology({4, 4}, node, local_ordinal);         // ordinals 0-3 and 4-7
//   auto local = std::make_unique<xs::ShmCommunicator>(
//       xs::Segment::attach(segment_name, local_ordinal, 4, job_id));
//   xs::MultiHostCommunicator comm(topology, std::move(local), store, "10.0.0.2",
//                                  {.prefix = "job42"});
//   comm.all_reduce(grads.data(), grads.size(), xs::DType::kF32, xs::ReduceOp::kMean);
//
// All-reduce. Every node cuts the buffer into one range per local ordinal, at whole cache
// lines (its cut). The local reduce (ShmCommunicator::reduce_ranges, zero-copy in the buffer
// arena) leaves in each replica's range its node's reduction of that range. The cuts of nodes
// with different replica counts do not line up, so the union of all cut points splits the
// buffer into pieces; a piece's holders, the replica on each node whose range contains it,
// are its group (detail/node_pieces.h). For each of its pieces, by increasing offset, a
// replica runs gloo's all-reduce over the piece's group (gloo rank = node) with the project's
// reduction of two operands: between two nodes bcube (each node reduces one half and sends it
// back; in slices of at most 16 MiB), among more the ring. Each element is reduced on one
// member and the result passed on, so every member gets the same bits. Mean sums throughout and divides once, by
// the world size, on the range's holder. The local gather (ShmCommunicator::gather_ranges)
// then hands every range to the node's other replicas. Per node, each byte of the payload
// crosses the network about 2(H-1)/H times for H nodes: 1.0x the payload at 2 nodes, where a
// flat ring over all replicas (two nodes of two) sends 1.5x.
//
// The other collectives reuse those nouns. Broadcast: a local broadcast on the root's node,
// each piece broadcast over its group from that node, local gathers elsewhere. All-gather: a
// local all-gather into the node's block of the output; every node's block is cut into pieces
// and sent from that node to the group's other members; local gathers of the other blocks.
// Reduce-scatter: a local reduce of the whole input, pieces cut also at the node blocks'
// boundaries and each sent to the node whose block holds it, which sums the partials in node
// order; a local gather of the node's own block. Both move a group's pieces of every block in
// one batch of gloo point-to-point transfers, all in flight at once, so each link carries
// data both ways at the same time (block by block, as gloo's broadcast and reduce would do
// it, one direction would wait for the other).
// Barrier and rendezvous: among the leaders (local ordinal 0 of every node) between local
// ones.
//
// Operands outside the node's buffer arena are staged through a scratch buffer from
// alloc_buffer, so the local phases run zero-copy. The bits are the same on every replica
// but, as gloo reduces in its own order, not ShmCommunicator's (order 0..N-1) when sums
// round: floats, and bf16, which rounds after every network hop.
//
// Failures. gloo's errors come out as xs::PeerFailure or xs::Timeout naming the call and the
// group: "all_reduce (f32, 669706 elements) across nodes 0-1 (ordinals 1, 3): gloo: Connection
// closed by peer [10.0.0.2]:41235". Any failure inside a collective breaks the communicator:
// it closes its connections (peers on other nodes fail at once), poisons its node's segment
// (peers on this node do), and every later call throws xs::PeerFailure with the first
// failure's message. Every wait is bounded by the collective timeout. Constructing one
// ignores SIGPIPE if that had its default action (detail/node_groups.cpp says why).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/collectives/node_topology.h"
#include "xla_spawn/collectives/shm_communicator.h"

namespace gloo::rendezvous {
class Store;
}

namespace xs {

namespace detail {
class NodeGroups;
struct CallInfo;
struct Hierarchy;
}  // namespace detail

struct MultiHostCommunicatorOptions {
  // Every wait's bound: gloo's connects, sends, receives and store waits. nullopt:
  // XLA_SPAWN_COLLECTIVE_TIMEOUT_MS, else kDefaultCollectiveTimeoutMs. Give the local
  // communicator the same.
  std::optional<int64_t> timeout_ms;
  // Prefix of every store key: unique per job (and per communicator of a job) sharing a store.
  std::string prefix = "xla-spawn";
};

class MultiHostCommunicator final : public Communicator {
 public:
  // `local`: this node's ShmCommunicator, its ordinal and world size the topology's local
  // ones. A node of one replica passes null, or one of world size 1 over the node's segment,
  // which then only keeps the launcher's hang report records (the calls and their transfers
  // between nodes) and runs no phase. `store`: the job's rendezvous store,
  // shared by every replica of every node. `address`: this node's address as the other nodes
  // reach it (gloo listens there). Throws xs::InvalidArgument naming the mismatch, and
  // xs::IoError when gloo cannot listen on `address`.
  MultiHostCommunicator(NodeTopology topology, std::unique_ptr<ShmCommunicator> local,
                        std::shared_ptr<gloo::rendezvous::Store> store, const std::string& address,
                        MultiHostCommunicatorOptions options = {});
  ~MultiHostCommunicator() override;
  MultiHostCommunicator(const MultiHostCommunicator&) = delete;
  MultiHostCommunicator& operator=(const MultiHostCommunicator&) = delete;

  int ordinal() const override { return topology_.ordinal(); }
  int world_size() const override { return topology_.world_size(); }

  void all_reduce(void* data, size_t n_elems, DType dtype, ReduceOp op) override;
  void broadcast(void* data, size_t n_elems, DType dtype, int root) override;
  void all_gather(const void* in, void* out, size_t n_elems, DType dtype) override;
  void reduce_scatter(const void* in, void* out, size_t n_elems, DType dtype, ReduceOp op) override;
  void barrier() override;
  std::vector<std::vector<std::byte>> rendezvous(const std::string& tag,
                                                 std::span<const std::byte> payload) override;

  // This node's buffer arena (the local communicator's); the heap on a node of one replica.
  void* alloc_buffer(size_t bytes) override;
  void free_buffer(void* data) override;
  // Registered with the local communicator, for the node-local phases.
  bool register_buffer(void* data, size_t bytes) override;
  void deregister_buffer(void* data) override;

  double network_seconds() const override;

  const NodeTopology& topology() const { return topology_; }
  // Group contexts created so far, and the wall time their creation (gloo's connectFullMesh)
  // took in all, in seconds.
  size_t group_contexts() const;
  double connect_seconds() const;

 private:
  // Runs one collective's body; any exception it throws breaks the communicator.
  void run(const detail::CallInfo& call, const std::function<void(const detail::Hierarchy&)>& body);
  void fail(const std::string& reason) noexcept;
  // What the local phases run on: `data` itself when it is in this node's arena (or there is
  // no local phase), else the scratch buffer, filled with data's bytes when `copy_in`.
  std::byte* operand_for(void* data, size_t n_bytes, bool copy_in);
  std::byte* scratch(size_t n_bytes);
  // The communicator over this node's segment, whose records the hang report reads: local_,
  // or a node of one replica's recorder_ (null when it was given none).
  ShmCommunicator* records_holder() const { return local_ ? local_.get() : recorder_.get(); }

  NodeTopology topology_;
  std::unique_ptr<ShmCommunicator> local_;     // null on a node of one replica
  std::unique_ptr<ShmCommunicator> recorder_;  // that node's world-size-1 one, for the records
  std::unique_ptr<detail::NodeGroups> groups_;
  std::byte* scratch_ = nullptr;  // from alloc_buffer, kept and grown
  size_t scratch_bytes_ = 0;
  std::optional<std::string> broken_;  // the failure that broke the communicator
};

}  // namespace xs
