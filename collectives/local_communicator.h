#pragma once
// The Communicator of a replica running alone (world size 1, no segment): every collective
// is the identity (or a copy into the output), costs no synchronisation and cannot fail,
// so the runtime and single-process binaries use the same code path as a job.
//
//   xs::LocalCommunicator comm;
//   comm.all_reduce(grads.data(), grads.size(), xs::DType::kF32, xs::ReduceOp::kMean);  // no-op

#include "xla_spawn/collectives/communicator.h"

namespace xs {

class LocalCommunicator final : public Communicator {
 public:
  int ordinal() const override { return 0; }
  int world_size() const override { return 1; }

  void all_reduce(void* data, size_t n_elems, DType dtype, ReduceOp op) override;
  void broadcast(void* data, size_t n_elems, DType dtype, int root) override;
  void all_gather(const void* in, void* out, size_t n_elems, DType dtype) override;
  void all_gather_pieces(const void* in, std::span<const GatherPiece> pieces, size_t n_elems,
                         DType dtype) override;
  void reduce_scatter(const void* in, void* out, size_t n_elems, DType dtype, ReduceOp op) override;
  void barrier() override {}
  std::vector<std::vector<std::byte>> rendezvous(const std::string& tag,
                                                 std::span<const std::byte> payload) override;
};

}  // namespace xs
