#pragma once
// The shared-memory collective schedules, one per file, each run by every ordinal with the
// same arguments inside a Rounds::begin_call. ShmCommunicator validates arguments, starts
// the call and picks the schedule; these functions assume world size >= 2.
//
//   rounds.begin_call("all_reduce", header);
//   detail::all_reduce_two_shot(rounds, data, n_elems, dtype, op);

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "xla_spawn/base/dtype.h"
#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/collectives/detail/rounds.h"

namespace xs::detail {

// With `yield_to_arena`, the one-shot and two-shot return false right after their first
// round (before touching `data`) when any ordinal published in_arena with it: those
// ordinals ran publish_operand() in that round instead, and everyone then starts the same
// schedule afresh. Otherwise they return true.
bool all_reduce_one_shot(Rounds& rounds, std::byte* data, size_t n_elems, DType dtype, ReduceOp op,
                         bool yield_to_arena = false);
bool all_reduce_two_shot(Rounds& rounds, std::byte* data, size_t n_elems, DType dtype, ReduceOp op,
                         bool yield_to_arena = false);
void all_reduce_ring(Rounds& rounds, std::byte* data, size_t n_elems, DType dtype, ReduceOp op);

// The first round of the in-place schedules (CMA, direct): every ordinal publishes its
// operand's address and its offset in its buffer arena (anything when not in it; the call
// header's in_arena says which). Returns the round's parity, which the schedule takes.
int publish_operand(Rounds& rounds, std::byte* data, uint64_t arena_offset);
// After publish_operand() with every operand in its owner's arena: each ordinal's operand of
// `operand_bytes` mapped into this process (`mine` for this ordinal's own), for the direct
// schedules. Throws xs::PeerFailure naming the ordinal when a published offset would put the
// operand outside its owner's arena (shared memory scribbled over).
std::vector<std::byte*> published_arena_operands(Rounds& rounds, int parity, std::byte* mine,
                                                 size_t operand_bytes);
// Elements per block for the direct schedules: N source blocks of it stay in L2.
size_t direct_block_elems(int world_size, size_t elem_bytes);
void* published_address(Rounds& rounds, int ordinal, int parity);
// After publish_operand(): CMA needs cross-memory access (negotiate_cma), direct needs
// every operand in its owner's arena (Rounds::all_in_arena).
void all_reduce_cma(Rounds& rounds, int parity, std::byte* data, size_t n_elems, DType dtype,
                    ReduceOp op);
void all_reduce_direct(Rounds& rounds, int parity, std::byte* data, size_t n_elems, DType dtype,
                       ReduceOp op);
// Whether every ordinal may read and write every other's memory (process_vm_readv/writev);
// a collective of two rounds whose verdict is the same on all ordinals.
bool negotiate_cma(Rounds& rounds);

void broadcast(Rounds& rounds, std::byte* data, size_t n_bytes, int root);
void all_gather(Rounds& rounds, const std::byte* in, std::byte* out, size_t n_bytes);
void reduce_scatter(Rounds& rounds, const std::byte* in, std::byte* out, size_t n_elems,
                    DType dtype, ReduceOp op);
// After publish_operand() of every input, all in arenas (Rounds::all_in_arena): the
// zero-copy forms. Reduce-scatter's inputs hold N chunks of n_elems; all-gather's n_bytes.
void reduce_scatter_direct(Rounds& rounds, int parity, const std::byte* in, std::byte* out,
                           size_t n_elems, DType dtype, ReduceOp op);
void all_gather_direct(Rounds& rounds, int parity, const std::byte* in,
                       std::span<const GatherPiece> out, size_t n_bytes);
// Range phases (ShmCommunicator::reduce_ranges, gather_ranges): `bounds` holds world_size + 1
// element offsets, ordinal k's range is [bounds[k], bounds[k + 1]). After publish_operand()
// with every operand in its owner's arena, the zero-copy forms; gather_ranges is the staging
// schedule for operands anywhere.
void reduce_ranges_direct(Rounds& rounds, int parity, std::byte* data, DType dtype, ReduceOp op,
                          std::span<const size_t> bounds);
void gather_ranges_direct(Rounds& rounds, int parity, std::byte* data, size_t elem_bytes,
                          std::span<const size_t> bounds);
void gather_ranges(Rounds& rounds, std::byte* data, size_t elem_bytes,
                   std::span<const size_t> bounds);
std::vector<std::vector<std::byte>> rendezvous(Rounds& rounds, const std::string& tag,
                                               std::span<const std::byte> payload);

// Elements per chunk when `slab_elems` are cut into world_size chunks: rounded up to whole
// cache lines so chunks never share one (the last chunks may be short or empty).
size_t chunk_elems(size_t slab_elems, int world_size, size_t elem_bytes);

}  // namespace xs::detail
