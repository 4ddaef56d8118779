#pragma once
// The Communicator of a replica in a multi-process job: collectives over the job's
// shared-memory segment (see collectives/detail/rounds.h for the synchronisation, and one
// file per schedule). Create one per attached segment, after Segment::attach.
//
//   xs::ShmCommunicator comm(xs::Segment::attach(name, ordinal, world_size, job_id));
//   comm.all_reduce(grads.data(), grads.size(), xs::DType::kF32, xs::ReduceOp::kMean);
//
// Waits time out after XLA_SPAWN_COLLECTIVE_TIMEOUT_MS (default 60 s); a dead peer, a
// timeout or a poisoned segment throw xs::PeerFailure / xs::Timeout naming the ordinal.

#include <memory>
#include <optional>

#include "collectives/all_reduce_algorithm.h"
#include "collectives/communicator.h"
#include "shm/segment.h"

namespace xs {

namespace detail {
class Rounds;
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
  void reduce_scatter(const void* in, void* out, size_t n_elems, DType dtype, ReduceOp op) override;
  void barrier() override;
  std::vector<std::vector<std::byte>> rendezvous(const std::string& tag,
                                                 std::span<const std::byte> payload) override;

  // The schedule all_reduce uses for this size (the forced one, if any; kCma reads as
  // kTwoShot once replicas were found not to be allowed cross-memory access).
  AllReduceAlgorithm all_reduce_algorithm(size_t n_bytes) const;
  const Segment& segment() const;

 private:
  std::unique_ptr<detail::Rounds> rounds_;
  std::optional<AllReduceAlgorithm> forced_;
  std::optional<bool> cma_;  // negotiated at the first kCma call: may replicas use CMA?
};

}  // namespace xs
