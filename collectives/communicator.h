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
//
// Memory that cannot come from alloc_buffer can be registered instead (register_buffer).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/dtype.h"

namespace xs {

// Where part of an all-gather's result goes when the result is never assembled in one buffer
// (Communicator::all_gather_pieces): gathered bytes [offset_bytes, offset_bytes + size_bytes)
// land at `data`.
struct GatherPiece {
  size_t offset_bytes = 0;
  size_t size_bytes = 0;
  void* data = nullptr;
};

// Copies gathered bytes [at_bytes, at_bytes + n_bytes), held at `from`, into the parts of the
// pieces that cover them (bytes no piece covers are dropped).
inline void copy_to_pieces(std::span<const GatherPiece> pieces, size_t at_bytes, const void* from,
                           size_t n_bytes) {
  for (const GatherPiece& p : pieces) {
    const size_t begin = std::max(at_bytes, p.offset_bytes);
    const size_t end = std::min(at_bytes + n_bytes, p.offset_bytes + p.size_bytes);
    if (begin >= end) continue;
    std::byte* to = static_cast<std::byte*>(p.data) + (begin - p.offset_bytes);
    const std::byte* src = static_cast<const std::byte*>(from) + (begin - at_bytes);
    if (to != src) std::memmove(to, src, end - begin);
  }
}

// Throws InvalidArgument for a dtype code that is not a DType (an integer cast carelessly).
inline void check_dtype(const char* operation, DType dtype) {
  XS_CHECK_ARG(static_cast<int>(dtype) < kNumDTypes, "{}: dtype code {} is not a dtype (0..{})",
               operation, static_cast<int>(dtype), kNumDTypes - 1);
}

// Throws InvalidArgument for a null buffer with elements, a bad dtype code, or `copies` times
// n_elems elements of dtype that overflow a byte count (every communicator checks each operand
// so).
inline void check_operand(const char* operation, const void* data, size_t n_elems, DType dtype,
                          int copies) {
  check_dtype(operation, dtype);
  XS_CHECK_ARG(data != nullptr || n_elems == 0, "{}: null buffer for {} elements", operation,
               n_elems);
  XS_CHECK_ARG(n_elems <= std::numeric_limits<size_t>::max() / dtype_size(dtype) /
                              static_cast<size_t>(copies),
               "{}: {} x {} elements of {} overflow a byte count", operation, copies, n_elems,
               dtype_name(dtype));
}

// Throws InvalidArgument unless every piece lies inside `total_bytes` gathered bytes.
inline void check_gather_pieces(std::span<const GatherPiece> pieces, size_t total_bytes) {
  for (const GatherPiece& p : pieces) {
    XS_CHECK_ARG(p.offset_bytes <= total_bytes && p.size_bytes <= total_bytes - p.offset_bytes &&
                     (p.data != nullptr || p.size_bytes == 0),
                 "all_gather_pieces: piece of {} bytes at {} (data {}) outside the {} gathered bytes",
                 p.size_bytes, p.offset_bytes, p.data, total_bytes);
  }
}

// Throws InvalidArgument when `chunk` (`chunk_bytes`: an all_gather's input, a reduce_scatter's
// output) overlaps a piece of the world-size-times-longer operand other than as this ordinal's
// own chunk, the in-place form: any other overlap has the call overwrite what it must still read.
inline void check_chunk_overlap(const char* call, const void* chunk, size_t chunk_bytes,
                                std::span<const GatherPiece> pieces, int ordinal) {
  const auto c = reinterpret_cast<uintptr_t>(chunk);
  for (const GatherPiece& p : pieces) {
    const auto d = reinterpret_cast<uintptr_t>(p.data);
    const bool overlap =
        chunk_bytes > 0 && p.size_bytes > 0 && c < d + p.size_bytes && d < c + chunk_bytes;
    XS_CHECK_ARG(!overlap || c + p.offset_bytes == d + static_cast<size_t>(ordinal) * chunk_bytes,
                 "{}: input and output overlap; they may only when the smaller one is exactly this "
                 "ordinal's chunk of the larger (in place)",
                 call);
  }
}
// The same for one whole operand at `whole`, `world_size` chunks long.
inline void check_chunk_overlap(const char* call, const void* chunk, size_t chunk_bytes,
                                const void* whole, int world_size, int ordinal) {
  const GatherPiece piece{0, chunk_bytes * static_cast<size_t>(world_size),
                          const_cast<void*>(whole)};
  check_chunk_overlap(call, chunk, chunk_bytes, std::span<const GatherPiece>(&piece, 1), ordinal);
}

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int ordinal() const = 0;
  virtual int world_size() const = 0;

  // In place on `n_elems` contiguous elements of `dtype` at `data`.
  virtual void all_reduce(void* data, size_t n_elems, DType dtype, ReduceOp op) = 0;
  // Copies root's `n_elems` elements at `data` into every other replica's `data`.
  virtual void broadcast(void* data, size_t n_elems, DType dtype, int root) = 0;
  // `out` holds world_size * n_elems elements: ordinal k's input lands at k * n_elems. `in`
  // may be this ordinal's chunk of `out` (in place); any other overlap is an InvalidArgument.
  virtual void all_gather(const void* in, void* out, size_t n_elems, DType dtype) = 0;
  // all_gather whose world_size * n_elems gathered elements go to `pieces` (which must not
  // overlap each other or `in`) rather than to one buffer: a sharded update gathers straight
  // into the parameters. Collective like all_gather; every replica may pass other pieces.
  // This default gathers into a temporary and copies; ShmCommunicator copies only once.
  virtual void all_gather_pieces(const void* in, std::span<const GatherPiece> pieces,
                                 size_t n_elems, DType dtype) {
    check_operand("all_gather", in, n_elems, dtype, world_size());
    const size_t total_bytes = n_elems * dtype_size(dtype) * static_cast<size_t>(world_size());
    check_gather_pieces(pieces, total_bytes);
    check_chunk_overlap("all_gather", in, n_elems * dtype_size(dtype), pieces, ordinal());
    std::vector<std::byte> whole(total_bytes);
    all_gather(in, whole.data(), n_elems, dtype);
    copy_to_pieces(pieces, 0, whole.data(), total_bytes);
  }
  // `in` holds world_size * n_elems elements; `out` gets this ordinal's reduced chunk. `out`
  // may be this ordinal's chunk of `in` (in place); any other overlap is an InvalidArgument.
  virtual void reduce_scatter(const void* in, void* out, size_t n_elems, DType dtype,
                              ReduceOp op) = 0;
  virtual void barrier() = 0;
  // Exchanges small payloads; every replica must pass the same tag. Returns every
  // ordinal's payload, indexed by ordinal.
  virtual std::vector<std::vector<std::byte>> rendezvous(const std::string& tag,
                                                         std::span<const std::byte> payload) = 0;

  // Seconds this replica has spent so far in the transport between nodes (a multi-node job's
  // network phases, waiting for peers included); 0 on a single node. A step's share of its
  // collectives that crossed the network is the difference across the step.
  virtual double network_seconds() const { return 0; }

  // Memory for collective operands, aligned to kBufferAlignBytes, never nullptr (falls back
  // to the heap when the fast kind runs out). Not collective; free with free_buffer of the
  // same communicator: anything else (a pointer it did not return, one freed already) is an
  // InvalidArgument, whichever kind the block was. This default is the heap.
  static constexpr size_t kBufferAlignBytes = 4096;
  virtual void* alloc_buffer(size_t bytes) {
    // libstdc++'s aligned new rounds the size up to the alignment first, which wraps to 0.
    if (bytes > std::numeric_limits<size_t>::max() - kBufferAlignBytes) throw std::bad_alloc();
    void* block = ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{kBufferAlignBytes});
    try {
      const std::lock_guard<std::mutex> lock(heap_blocks_mutex_);
      heap_blocks_.insert(block);
    } catch (...) {
      ::operator delete (block, std::align_val_t{kBufferAlignBytes});
      throw;
    }
    return block;
  }
  virtual void free_buffer(void* data) {
    if (data == nullptr) return;
    {
      // A pointer alloc_buffer did not return would corrupt the heap (or abort in free).
      const std::lock_guard<std::mutex> lock(heap_blocks_mutex_);
      if (heap_blocks_.erase(data) == 0) {
        throw InvalidArgument(fmt::format(
            "free_buffer: {} is not a block alloc_buffer returned, or was freed already", data));
      }
    }
    ::operator delete (data, std::align_val_t{kBufferAlignBytes});
  }

  // Registers memory the caller already has (a std::vector, a tensor's storage) for zero-copy
  // collectives, as NCCL's ncclCommRegister does: true when from now on operands inside
  // [data, data + bytes) are read and written in place by peers, false when this memory cannot
  // be (the call changed nothing; collectives on it still work, through copies, or zero-copy
  // already for memory from alloc_buffer). Not
  // collective. The memory must stay allocated until deregister_buffer (or the communicator's
  // end), and nothing may write it while either call runs; a child forked meanwhile gets a
  // copy of its pages, as of any private memory (made at the fork). This default registers nothing.
  virtual bool register_buffer(void* data, size_t bytes) {
    (void)data;
    (void)bytes;
    return false;
  }
  // Ends the registration that starts at `data`; the memory keeps its contents.
  virtual void deregister_buffer(void* data) { (void)data; }

 private:
  std::mutex heap_blocks_mutex_;
  std::unordered_set<void*> heap_blocks_;  // alloc_buffer's blocks from the heap, until freed
};

}  // namespace xs
