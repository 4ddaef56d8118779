#include "xla_spawn/collectives/local_communicator.h"

#include <cstring>

#include "xla_spawn/base/check.h"
#include "xla_spawn/collectives/reduce.h"

namespace xs {

void LocalCommunicator::all_reduce(void*, size_t, DType dtype, ReduceOp) {
  check_reducible("all_reduce", dtype);  // same contract as a job, so bugs show up alone too
}

void LocalCommunicator::broadcast(void*, size_t, DType, int root) {
  XS_CHECK_ARG(root == 0, "broadcast: root {} outside 0..0 (world size 1)", root);
}

void LocalCommunicator::all_gather(const void* in, void* out, size_t n_elems, DType dtype) {
  const size_t bytes = n_elems * dtype_size(dtype);
  check_chunk_overlap("all_gather", in, bytes, out, 1, 0);
  if (bytes != 0 && in != out) std::memmove(out, in, bytes);
}

void LocalCommunicator::all_gather_pieces(const void* in, std::span<const GatherPiece> pieces,
                                          size_t n_elems, DType dtype) {
  const size_t bytes = n_elems * dtype_size(dtype);
  check_gather_pieces(pieces, bytes);
  check_chunk_overlap("all_gather", in, bytes, pieces, 0);
  copy_to_pieces(pieces, 0, in, bytes);
}

void LocalCommunicator::reduce_scatter(const void* in, void* out, size_t n_elems, DType dtype,
                                       ReduceOp op) {
  check_reducible("reduce_scatter", dtype);
  const size_t bytes = n_elems * dtype_size(dtype);
  check_chunk_overlap("reduce_scatter", out, bytes, in, 1, 0);
  if (bytes != 0 && in != out) std::memmove(out, in, bytes);
  (void)op;  // sum, mean, max and min of one replica: the input itself
}

std::vector<std::vector<std::byte>> LocalCommunicator::rendezvous(
    const std::string&, std::span<const std::byte> payload) {
  return {std::vector<std::byte>(payload.begin(), payload.end())};
}

}  // namespace xs
