#pragma once
// The collective operations a replica can call, as an abstract interface. The runtime's
// in-graph all-reduce node and the replica API call through it; the shared-memory
// implementation lives beside it in collectives/, and a world-size-1 implementation makes
// every call a no-op, so the runtime builds and tests alone.
//
//   comm.all_reduce(grads.data(), grads.size(), DType::kF32, ReduceOp::kMean);
//
// Every call is collective: all replicas must call the same operation, in the same order,
// with the same element count and dtype; a mismatch is an xs::PeerFailure naming both sides.
//
// Operands may live anywhere. Those from alloc_buffer (like MPI_Alloc_mem, or NCCL's
// registered user buffers) let the shared-memory implementation reduce in place, without
// staging copies, when every replica passes one:
//
//   float* grads = static_cast<float*>(comm.alloc_buffer(n * sizeof(float)));
//   comm.all_reduce(grads, n, DType::kF32, ReduceOp::kSum);   // zero-copy
//   comm.free_buffer(grads);

#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace xs {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int ordinal() const = 0;
  virtual int world_size() const = 0;

  // In place on `n_elems` contiguous elements of `dtype` at `data`.
  virtual void all_reduce(void* data, size_t n_elems, DType dtype, ReduceOp op) = 0;
  // Copies root's `n_elems` elements at `data` into every other replica's `data`.
  virtual void broadcast(void* data, size_t n_elems, DType dtype, int root) = 0;
  // `out` holds world_size * n_elems elements: ordinal k's input lands at k * n_elems.
  virtual void all_gather(const void* in, void* out, size_t n_elems, DType dtype) = 0;
  // `in` holds world_size * n_elems elements; `out` gets this ordinal's reduced chunk.
  virtual void reduce_scatter(const void* in, void* out, size_t n_elems, DType dtype,
                              ReduceOp op) = 0;
  virtual void barrier() = 0;
  // Exchanges small payloads; every replica must pass the same tag. Returns every
  // ordinal's payload, indexed by ordinal.
  virtual std::vector<std::vector<std::byte>> rendezvous(const std::string& tag,
                                                         std::span<const std::byte> payload) = 0;

  // Memory for collective operands, aligned to kBufferAlignBytes, never nullptr (falls back
  // to the heap when the fast kind runs out). Not collective; free with free_buffer of the
  // same communicator. This default is the heap.
  static constexpr size_t kBufferAlignBytes = 4096;
  virtual void* alloc_buffer(size_t bytes) {
    return ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{kBufferAlignBytes});
  }
  virtual void free_buffer(void* data) {
    ::operator delete (data, std::align_val_t{kBufferAlignBytes});
  }
};

}  // namespace xs
