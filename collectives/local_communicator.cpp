#include "xla_spawn/collectives/local_communicator.h"

#include <cstring>

#include "xla_spawn/base/check.h"
#include "xla_spawn/collectives/reduce.h"

namespace xs {

// The same checks as a job's communicator, so bugs show up alone too.
void LocalCommunicator::all_reduce(void* data, size_t n_elems, DType dtype, ReduceOp op) {
  check_reducible("all_reduce", dtype, op);
  check_operand("all_reduce", data, n_elems, dtype, 1);
}

void LocalCommunicator::broadcast(void* data, size_t n_elems, DType dtype, int root) {
  XS_CHECK_ARG(root == 0, "broadcast: root {} outside 0..0 (world size 1)", root);
  check_operand("broadcast", data, n_elems, dtype, 1);
}

void LocalCommunicator::all_gather(const void* in, void* out, size_t n_elems, DType dtype) {
  check_operand("all_gather", in, n_elems, dtype, 1);
  check_operand("all_gather", out, n_elems, dtype, 1);
  const size_t bytes = n_elems * dtype_size(dtype);
  check_chunk_overlap("all_gather", in, bytes, out, 1, 0);
  if (bytes != 0 && in != out) std::memmove(out, in, bytes);
}

void LocalCommunicator::all_gather_pieces(const void* in, std::span<const GatherPiece> pieces,
                                          size_t n_elems, DType dtype) {
  check_operand("all_gather", in, n_elems, dtype, 1);
  const size_t bytes = n_elems * dtype_size(dtype);
  check_gather_pieces(pieces, bytes);
  check_chunk_overlap("all_gather", in, bytes, pieces, 0);
  copy_to_pieces(pieces, 0, in, bytes);
}

void LocalCommunicator::reduce_scatter(const void* in, void* out, size_t n_elems, DType dtype,
                                       ReduceOp op) {
  check_reducible("reduce_scatter", dtype, op);
  check_operand("reduce_scatter", in, n_elems, dtype, 1);
  check_operand("reduce_scatter", out, n_elems, dtype, 1);
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
