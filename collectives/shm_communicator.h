#pragma once
// The Communicator of a replica in a multi-process job: collectives over the job's
// shared-memory segment (see collectives/detail/rounds.h for the synchronisation, and one
// file per schedule). Create one per attached segment, after Segment::attach.
//
//   xs::ShmCommunicator comm(xs::Segment::attach(name, ordinal, world_size, job_id));
//   comm.all_reduce(grads.data(), grads.size(), xs::DType::kF32, xs::ReduceOp::kMean);
//
// Operands from alloc_buffer() live in this ordinal's buffer arena in the segment; when every
// replica passes one, all_reduce from direct_min_bytes up runs the zero-copy kDirect
// schedule (see all_reduce_algorithm.h); so do buffers from register_buffer. Any other
// memory works too, through staging or CMA.
//
// Waits time out after XLA_SPAWN_COLLECTIVE_TIMEOUT_MS (default 60 s); a dead peer, a
// timeout or a poisoned segment throw xs::PeerFailure / xs::Timeout naming the ordinal.

#include <memory>
#include <optional>

#include "xla_spawn/collectives/all_reduce_algorithm.h"
#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/shm/segment.h"

namespace xs {

class BufferArena;

namespace detail {
class Rounds;
class RegisteredBuffers;
struct Registration;
}

struct ShmCommunicatorOptions {
  // Forces one all-reduce schedule; nullopt: XLA_SPAWN_ALLREDUCE_ALGO, else chosen per call.
  std::optional<AllReduceAlgorithm> algorithm;
  // nullopt: XLA_SPAWN_COLLECTIVE_TIMEOUT_MS, else kDefaultCollectiveTimeoutMs.
  std::optional<int64_t> timeout_ms;
};

class ShmCommunicator final : public Communicator {
 public:
  explicit ShmCommunicator(Segment segment, ShmCommunicatorOptions options = {});
  ~ShmCommunicator() override;

  int ordinal() const override;
  int world_size() const override;

  void all_reduce(void* data, size_t n_elems, DType dtype, ReduceOp op) override;
  void broadcast(void* data, size_t n_elems, DType dtype, int root) override;
  void all_gather(const void* in, void* out, size_t n_elems, DType dtype) override;
  void all_gather_pieces(const void* in, std::span<const GatherPiece> pieces, size_t n_elems,
                         DType dtype) override;
  void reduce_scatter(const void* in, void* out, size_t n_elems, DType dtype, ReduceOp op) override;
  void barrier() override;
  std::vector<std::vector<std::byte>> rendezvous(const std::string& tag,
                                                 std::span<const std::byte> payload) override;

  // The host-local phases of the hierarchical collectives (multi_host_communicator.h);
  // collective like the others: every ordinal passes the same n_elems, dtype and bounds (a
  // difference is an xs::PeerFailure naming both ordinals). `bounds` holds world_size + 1
  // element offsets, 0 .. n_elems; ordinal k's range is [bounds[k], bounds[k + 1]), and may be
  // empty. Zero-copy when every ordinal's `data` is in its buffer arena, else through staging.
  //
  // After reduce_ranges, ordinal k's range of its own `data` holds the reduction over every
  // ordinal's data in that range (order 0..N-1: the bits all_reduce gives); the rest of
  // `data` is unspecified.
  void reduce_ranges(void* data, size_t n_elems, DType dtype, ReduceOp op,
                     std::span<const size_t> bounds);
  // After gather_ranges, every ordinal's `data` holds in each range k ordinal k's bytes of
  // that range.
  void gather_ranges(void* data, size_t n_elems, DType dtype, std::span<const size_t> bounds);

  // From this ordinal's buffer arena; the heap when the arena is full (or absent).
  void* alloc_buffer(size_t bytes) override;
  void free_buffer(void* data) override;
  // Moves the buffer's whole pages into this ordinal's buffer arena (detail/registered_buffers.h):
  // false when it spans fewer than 16 KiB of whole pages, is not private anonymous memory
  // (the heap, an anonymous mapping), does not fit the arena or /dev/shm, or is an
  // alloc_buffer block (zero-copy already, nothing to register).
  bool register_buffer(void* data, size_t bytes) override;
  void deregister_buffer(void* data) override;
  // Whether [data, data + bytes) lies in this ordinal's buffer arena: in an alloc_buffer block
  // or a registered buffer.
  bool in_arena(const void* data, size_t bytes) const;

  // The schedule all_reduce uses for this size (the forced one, if any; kCma reads as
  // kTwoShot once replicas were found not to be allowed cross-memory access), for operands
  // outside the arena, or inside it when `in_arena` (kDirect where every replica's is).
  AllReduceAlgorithm all_reduce_algorithm(size_t n_bytes, bool in_arena = false) const;
  const Segment& segment() const;

  // For MultiHostCommunicator: this replica is in the network phase of its call `operation`
  // (transfers between nodes, outside this communicator's calls) until network_phase_done(),
  // and the launcher's hang report says so, with how long it has waited there. A phase that
  // fails is left marked: the report shows where the replica was when it did.
  void network_phase(const char* operation, std::optional<DType> dtype, size_t n_elems);
  void network_phase_done();

 private:
  // Where peers find an operand of this ordinal in its arena, if they can, and what the direct
  // schedules run on here: the operand itself, or a registered one's arena view (whose
  // partial end pages publish() mirrors in and land() copies back).
  struct Placed {
    bool in_arena = false;
    uint64_t offset = 0;
    std::byte* direct = nullptr;
    const detail::Registration* registered = nullptr;
  };
  Placed place(const void* data, size_t bytes) const;
  // Round 1 of the in-place schedules: mirrors a registered operand's edges, then publishes
  // it (detail::publish_operand). Returns the round's parity.
  int publish(const Placed& placed, const void* data, size_t bytes);
  // After a direct schedule wrote the operand: a registered one's edge bytes back into place.
  static void land(const Placed& placed, void* data, size_t bytes);
  void all_reduce_in_place(std::byte* data, size_t n_elems, DType dtype, ReduceOp op,
                           AllReduceAlgorithm base, bool cma, const Placed& placed);

  std::unique_ptr<detail::Rounds> rounds_;
  std::unique_ptr<BufferArena> arena_;
  std::unique_ptr<detail::RegisteredBuffers> registered_;  // before arena_ and rounds_ go
  std::optional<AllReduceAlgorithm> forced_;
  std::optional<bool> cma_;  // negotiated at the first kCma call: may replicas use CMA?
};

}  // namespace xs
