#include "xla_spawn/collectives/shm_communicator.h"

#include <sys/mman.h>
#include <sys/statvfs.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/splitmix64.h"
#include "xla_spawn/base/trace.h"
#include "xla_spawn/collectives/buffer_arena.h"
#include "xla_spawn/collectives/detail/registered_buffers.h"
#include "xla_spawn/collectives/detail/rounds.h"
#include "xla_spawn/collectives/detail/schedules.h"
#include "xla_spawn/collectives/reduce.h"
#include "xla_spawn/shm/wait.h"

namespace xs {
namespace {

using detail::CallHeader;
using detail::CallKind;

// Said once per process: which allocations fell back to the heap, and why.
void warn_arena_unbacked(size_t bytes) {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  struct statvfs fs {};
  const std::string free_text =
      ::statvfs("/dev/shm", &fs) == 0
          ? fmt::format("{:.1f} MiB free of {:.1f} MiB", static_cast<double>(fs.f_bavail) * fs.f_frsize / (1 << 20),
                        static_cast<double>(fs.f_blocks) * fs.f_frsize / (1 << 20))
          : std::string("free space unknown");
  spdlog::warn(
      "/dev/shm cannot back a {}-byte collective buffer ({}): buffers that do not fit come from the heap, "
      "and their collectives copy through the segment's staging area (slower); give /dev/shm more space",
      bytes, free_text);
}

// Largest tag + payload a rendezvous carries: it must fit one staging half with its lengths.
size_t rendezvous_capacity(const detail::Rounds& rounds) {
  return rounds.half_bytes() - 2 * sizeof(uint64_t);
}

// Throws InvalidArgument unless `bounds` are world_size + 1 non-decreasing element offsets
// from 0 to n_elems. Returns their digest, which the call header carries: ordinals that pass
// different bounds then fail the header check (a PeerFailure naming both) rather than
// skipping or overwriting each other's ranges.
int32_t bounds_digest(const char* operation, const void* data, size_t n_elems,
                      std::span<const size_t> bounds, int world_size) {
  XS_CHECK_ARG(data != nullptr || n_elems == 0, "{}: null buffer for {} elements", operation,
               n_elems);
  XS_CHECK_ARG(bounds.size() == static_cast<size_t>(world_size) + 1,
               "{}: {} bounds for world size {}, expected {}", operation, bounds.size(), world_size,
               world_size + 1);
  XS_CHECK_ARG(bounds.front() == 0 && bounds.back() == n_elems,
               "{}: bounds run from {} to {}, expected 0 to the element count {}", operation,
               bounds.front(), bounds.back(), n_elems);
  uint64_t digest = 0;
  for (size_t k = 0; k < bounds.size(); ++k) {
    XS_CHECK_ARG(k == 0 || bounds[k - 1] <= bounds[k],
                 "{}: bounds[{}] = {} is below bounds[{}] = {}", operation, k, bounds[k], k - 1,
                 bounds[k - 1]);
    digest = splitmix64_finalize(digest + kSplitMix64Increment + bounds[k]);
  }
  return static_cast<int32_t>(digest & 0x7fffffff);
}

}  // namespace

ShmCommunicator::ShmCommunicator(Segment segment, ShmCommunicatorOptions options)
    : forced_(options.algorithm ? options.algorithm : all_reduce_algorithm_from_env()) {
  const int64_t timeout_ms = options.timeout_ms.value_or(collective_timeout_ms_from_env());
  XS_CHECK_ARG(timeout_ms > 0, "ShmCommunicator: timeout {} ms must be positive", timeout_ms);
  rounds_ = std::make_unique<detail::Rounds>(std::move(segment), timeout_ms);
  arena_ = std::make_unique<BufferArena>(rounds_->segment().arena(ordinal()),
                                         rounds_->segment().arena_bytes());
  registered_ = std::make_unique<detail::RegisteredBuffers>(*arena_);
}

ShmCommunicator::~ShmCommunicator() = default;

int ShmCommunicator::ordinal() const {
  return rounds_->ordinal();
}
int ShmCommunicator::world_size() const {
  return rounds_->world_size();
}
const Segment& ShmCommunicator::segment() const {
  return rounds_->segment();
}

void ShmCommunicator::network_phase(const char* operation, std::optional<DType> dtype,
                                    size_t n_elems) {
  rounds_->begin_network_phase(operation, dtype, n_elems);
}

void ShmCommunicator::network_phase_done() { rounds_->end_network_phase(); }

void* ShmCommunicator::alloc_buffer(size_t bytes) {
  if (void* block = arena_->allocate(bytes)) {
    if (populate_arena_pages(block, bytes)) return block;
    arena_->deallocate(block);
    warn_arena_unbacked(bytes);
  }
  return Communicator::alloc_buffer(bytes);
}

void ShmCommunicator::free_buffer(void* data) {
  if (data == nullptr) return;
  if (arena_->contains(data, 0)) return arena_->deallocate(data);
  Communicator::free_buffer(data);
}

bool ShmCommunicator::register_buffer(void* data, size_t bytes) {
  if (arena_->contains(data, bytes)) return false;  // an alloc_buffer block: zero-copy already
  return registered_->add(data, bytes);
}

void ShmCommunicator::deregister_buffer(void* data) {
  registered_->remove(data);
}

bool ShmCommunicator::in_arena(const void* data, size_t bytes) const {
  return place(data, bytes).in_arena;
}

ShmCommunicator::Placed ShmCommunicator::place(const void* data, size_t bytes) const {
  if (bytes == 0) return {};
  auto* at = const_cast<std::byte*>(static_cast<const std::byte*>(data));
  if (arena_->contains(data, bytes)) return {true, arena_->offset(data), at, nullptr};
  if (const detail::Registration* r = registered_->find(data, bytes)) {
    return {true, r->offset(data), r->view(data), r};
  }
  return {};
}

int ShmCommunicator::publish(const Placed& placed, const void* data, size_t bytes) {
  if (placed.registered) detail::RegisteredBuffers::edges_in(*placed.registered, data, bytes);
  return detail::publish_operand(*rounds_, const_cast<std::byte*>(static_cast<const std::byte*>(data)),
                                 placed.offset);
}

void ShmCommunicator::land(const Placed& placed, void* data, size_t bytes) {
  if (placed.registered) detail::RegisteredBuffers::edges_out(*placed.registered, data, bytes);
}

AllReduceAlgorithm ShmCommunicator::all_reduce_algorithm(size_t n_bytes, bool in_arena) const {
  const AllReduceAlgorithm chosen =
      forced_
          ? *forced_
          : choose_all_reduce_algorithm(n_bytes, world_size(), segment().spin_allowed(), in_arena);
  // CMA that turned out not to be permitted runs as the staging two-shot.
  if (chosen == AllReduceAlgorithm::kCma && cma_ == false) return AllReduceAlgorithm::kTwoShot;
  return chosen;
}

// Which schedule runs must not depend on where one replica's operand lives, yet kDirect
// needs every operand in an arena. So every replica first makes the choice for operands
// outside the arena (`base`, by size or forced); a replica whose operand is in its arena
// and big enough for kDirect publishes it in round 1 (publish_operand, in_arena flag set)
// instead, and round 1's flags decide the rest:
// - base CMA (a core per replica) and forced kDirect: everyone publishes its operand in
//   round 1, then runs kDirect if all are in arenas, else CMA (where permitted) or a
//   fresh two-shot.
// - base one-shot or two-shot: the others start that schedule, whose round 1 carries their
//   input. All in arenas: kDirect; none: the schedule goes on; some: everyone starts the
//   base schedule afresh (one wasted round, only when replicas pass different kinds of
//   operand).
// Forced schedules other than kDirect ignore the arena.
void ShmCommunicator::all_reduce(void* data, size_t n_elems, DType dtype, ReduceOp op) {
  check_reducible("all_reduce", dtype, op);
  check_operand("all_reduce", data, n_elems, dtype, 1);
  if (world_size() == 1) return;  // sum, mean, max and min of one replica: the input
  auto* bytes = static_cast<std::byte*>(data);
  const size_t n_bytes = n_elems * dtype_size(dtype);
  const bool forced_direct = forced_ == AllReduceAlgorithm::kDirect;
  const Placed placed = place(data, n_bytes);
  const bool arena = placed.in_arena;
  AllReduceAlgorithm base =
      forced_ ? *forced_
              : choose_all_reduce_algorithm(n_bytes, world_size(), segment().spin_allowed());
  const bool direct = arena && (forced_direct || (!forced_ && all_reduce_algorithm(n_bytes, true) ==
                                                                  AllReduceAlgorithm::kDirect));
  TraceScope span("all_reduce", "collective");
  span.arg("bytes", static_cast<int64_t>(n_bytes));
  span.arg("schedule", direct ? "direct (arena)" : all_reduce_algorithm_name(base).data());
  // A forced schedule is part of the call: replicas forcing different ones (their own
  // XLA_SPAWN_ALLREDUCE_ALGO) would run rounds that do not pair up.
  const int32_t schedule = forced_ ? 1 + static_cast<int32_t>(*forced_) : 0;
  rounds_->begin_call("all_reduce",
                      CallHeader{CallKind::kAllReduce, dtype, op, n_elems, schedule, direct});
  const detail::CallEnd end(*rounds_);
  // CMA permission is a collective of its own, negotiated once, by everyone at once.
  const bool wants_cma =
      base == AllReduceAlgorithm::kCma || (forced_direct && segment().spin_allowed());
  if (wants_cma && !cma_) cma_ = detail::negotiate_cma(*rounds_);
  const bool cma = wants_cma && *cma_;
  if (base == AllReduceAlgorithm::kCma && !cma) base = AllReduceAlgorithm::kTwoShot;
  if (direct || base == AllReduceAlgorithm::kCma || forced_direct) {
    return all_reduce_in_place(bytes, n_elems, dtype, op, base, cma, placed);
  }
  const bool yield = !forced_;
  switch (base) {
    case AllReduceAlgorithm::kOneShot:
      if (detail::all_reduce_one_shot(*rounds_, bytes, n_elems, dtype, op, yield)) return;
      detail::all_reduce_one_shot(*rounds_, bytes, n_elems, dtype, op);  // mixed operands
      return;
    case AllReduceAlgorithm::kRing:
      return detail::all_reduce_ring(*rounds_, bytes, n_elems, dtype, op);
    default:
      if (detail::all_reduce_two_shot(*rounds_, bytes, n_elems, dtype, op, yield)) return;
      detail::all_reduce_two_shot(*rounds_, bytes, n_elems, dtype, op);  // mixed operands
      return;
  }
}

// Round 1 publishes every operand; then kDirect, or the fallback for `base` (see all_reduce).
// kDirect runs on the arena's view of a registered operand, whose edges peers write there;
// the other schedules on `data`, whose interior is the same pages.
void ShmCommunicator::all_reduce_in_place(std::byte* data, size_t n_elems, DType dtype, ReduceOp op,
                                          AllReduceAlgorithm base, bool cma, const Placed& placed) {
  const size_t n_bytes = n_elems * dtype_size(dtype);
  const int parity = publish(placed, data, n_bytes);
  if (rounds_->all_in_arena(parity)) {
    detail::all_reduce_direct(*rounds_, parity, placed.direct, n_elems, dtype, op);
    return land(placed, data, n_bytes);
  }
  if (cma) return detail::all_reduce_cma(*rounds_, parity, data, n_elems, dtype, op);
  if (base == AllReduceAlgorithm::kOneShot) {
    detail::all_reduce_one_shot(*rounds_, data, n_elems, dtype, op);
    return;
  }
  detail::all_reduce_two_shot(*rounds_, data, n_elems, dtype, op);
}

void ShmCommunicator::broadcast(void* data, size_t n_elems, DType dtype, int root) {
  XS_CHECK_ARG(root >= 0 && root < world_size(), "broadcast: root {} outside 0..{}", root,
               world_size() - 1);
  check_operand("broadcast", data, n_elems, dtype, 1);
  if (world_size() == 1) return;
  TraceScope span("broadcast", "collective");
  span.arg("bytes", static_cast<int64_t>(n_elems * dtype_size(dtype)));
  rounds_->begin_call("broadcast",
                      CallHeader{CallKind::kBroadcast, dtype, ReduceOp::kSum, n_elems, root});
  const detail::CallEnd end(*rounds_);
  detail::broadcast(*rounds_, static_cast<std::byte*>(data), n_elems * dtype_size(dtype), root);
}

// All-gather and reduce-scatter always publish their input in round 1 (as all_reduce's
// in-place schedules do): when every input is in its owner's arena the zero-copy direct form
// runs, else the staging schedule (one round later).
void ShmCommunicator::all_gather(const void* in, void* out, size_t n_elems, DType dtype) {
  check_operand("all_gather", out, n_elems, dtype, world_size());
  const GatherPiece whole{0, n_elems * dtype_size(dtype) * static_cast<size_t>(world_size()), out};
  all_gather_pieces(in, std::span<const GatherPiece>(&whole, 1), n_elems, dtype);
}

// The direct form copies each peer's input straight into the pieces; the staging schedule
// writes one buffer, so pieces other than one whole output go through a private one.
void ShmCommunicator::all_gather_pieces(const void* in, std::span<const GatherPiece> pieces,
                                        size_t n_elems, DType dtype) {
  check_operand("all_gather", in, n_elems, dtype, world_size());
  const size_t bytes = n_elems * dtype_size(dtype);
  const size_t total_bytes = bytes * static_cast<size_t>(world_size());
  check_gather_pieces(pieces, total_bytes);
  check_chunk_overlap("all_gather", in, bytes, pieces, ordinal());
  if (world_size() == 1) return copy_to_pieces(pieces, 0, in, bytes);
  const Placed placed = place(in, bytes);
  TraceScope span("all_gather", "collective");
  span.arg("bytes", static_cast<int64_t>(total_bytes));
  rounds_->begin_call("all_gather", CallHeader{CallKind::kAllGather, dtype, ReduceOp::kSum,
                                               n_elems, 0, placed.in_arena});
  const detail::CallEnd end(*rounds_);
  const auto* from = static_cast<const std::byte*>(in);
  const int parity = publish(placed, in, bytes);
  if (rounds_->all_in_arena(parity))
    return detail::all_gather_direct(*rounds_, parity, from, pieces, bytes);
  if (pieces.size() == 1 && pieces[0].offset_bytes == 0 && pieces[0].size_bytes == total_bytes) {
    return detail::all_gather(*rounds_, from, static_cast<std::byte*>(pieces[0].data), bytes);
  }
  std::vector<std::byte>& whole = rounds_->scratch(total_bytes);
  detail::all_gather(*rounds_, from, whole.data(), bytes);
  copy_to_pieces(pieces, 0, whole.data(), total_bytes);
}

void ShmCommunicator::reduce_scatter(const void* in, void* out, size_t n_elems, DType dtype,
                                     ReduceOp op) {
  check_reducible("reduce_scatter", dtype, op);
  check_operand("reduce_scatter", in, n_elems, dtype, world_size());
  check_operand("reduce_scatter", out, n_elems, dtype, 1);
  check_chunk_overlap("reduce_scatter", out, n_elems * dtype_size(dtype), in, world_size(),
                      ordinal());
  if (world_size() == 1) {
    const void* sources[] = {in};
    reduce_sources(out, nullptr, sources, 1, n_elems, dtype, op, 1);
    return;
  }
  const size_t in_bytes = n_elems * static_cast<size_t>(world_size()) * dtype_size(dtype);
  const Placed placed = place(in, in_bytes);
  TraceScope span("reduce_scatter", "collective");
  span.arg("bytes", static_cast<int64_t>(in_bytes));
  rounds_->begin_call("reduce_scatter",
                      CallHeader{CallKind::kReduceScatter, dtype, op, n_elems, 0, placed.in_arena});
  const detail::CallEnd end(*rounds_);
  const auto* from = static_cast<const std::byte*>(in);
  auto* to = static_cast<std::byte*>(out);
  const int parity = publish(placed, in, in_bytes);
  if (rounds_->all_in_arena(parity)) {
    return detail::reduce_scatter_direct(*rounds_, parity, from, to, n_elems, dtype, op);
  }
  detail::reduce_scatter(*rounds_, from, to, n_elems, dtype, op);
}

// The range phases publish their operand in round 1, like all-gather and reduce-scatter:
// the direct forms when every operand is in its owner's arena, else reduce_ranges reduces the
// whole buffer with the staging all-reduce of its size (same order, same bits) and
// gather_ranges runs its staging schedule.
void ShmCommunicator::reduce_ranges(void* data, size_t n_elems, DType dtype, ReduceOp op,
                                    std::span<const size_t> bounds) {
  check_reducible("reduce_ranges", dtype, op);
  const int32_t digest = bounds_digest("reduce_ranges", data, n_elems, bounds, world_size());
  if (world_size() == 1) return;  // the reduction of one replica: its input
  auto* bytes = static_cast<std::byte*>(data);
  const size_t n_bytes = n_elems * dtype_size(dtype);
  const Placed placed = place(data, n_bytes);
  TraceScope span("reduce_ranges", "collective");
  span.arg("bytes", static_cast<int64_t>(n_bytes));
  rounds_->begin_call("reduce_ranges", CallHeader{CallKind::kReduceRanges, dtype, op, n_elems,
                                                  digest, placed.in_arena});
  const detail::CallEnd end(*rounds_);
  const int parity = publish(placed, data, n_bytes);
  if (rounds_->all_in_arena(parity)) {
    detail::reduce_ranges_direct(*rounds_, parity, placed.direct, dtype, op, bounds);
    return land(placed, data, n_bytes);
  }
  if (n_bytes <= one_shot_max_bytes(world_size())) {
    detail::all_reduce_one_shot(*rounds_, bytes, n_elems, dtype, op);
    return;
  }
  detail::all_reduce_two_shot(*rounds_, bytes, n_elems, dtype, op);
}

void ShmCommunicator::gather_ranges(void* data, size_t n_elems, DType dtype,
                                    std::span<const size_t> bounds) {
  check_dtype("gather_ranges", dtype);
  const int32_t digest = bounds_digest("gather_ranges", data, n_elems, bounds, world_size());
  if (world_size() == 1) return;
  auto* bytes = static_cast<std::byte*>(data);
  const size_t n_bytes = n_elems * dtype_size(dtype);
  const Placed placed = place(data, n_bytes);
  TraceScope span("gather_ranges", "collective");
  span.arg("bytes", static_cast<int64_t>(n_bytes));
  rounds_->begin_call("gather_ranges", CallHeader{CallKind::kGatherRanges, dtype, ReduceOp::kSum,
                                                  n_elems, digest, placed.in_arena});
  const detail::CallEnd end(*rounds_);
  const int parity = publish(placed, data, n_bytes);
  if (rounds_->all_in_arena(parity)) {
    detail::gather_ranges_direct(*rounds_, parity, placed.direct, dtype_size(dtype), bounds);
    return land(placed, data, n_bytes);
  }
  detail::gather_ranges(*rounds_, bytes, dtype_size(dtype), bounds);
}

void ShmCommunicator::barrier() {
  if (world_size() == 1) return;
  TraceScope span("barrier", "collective");
  rounds_->begin_call("barrier", CallHeader{});
  const detail::CallEnd end(*rounds_);
  rounds_->sync();
}

std::vector<std::vector<std::byte>> ShmCommunicator::rendezvous(
    const std::string& tag, std::span<const std::byte> payload) {
  XS_CHECK_ARG(tag.size() + payload.size() <= rendezvous_capacity(*rounds_),
               "rendezvous '{}': tag and payload take {} bytes, at most {} fit the staging", tag,
               tag.size() + payload.size(), rendezvous_capacity(*rounds_));
  if (world_size() == 1) return {std::vector<std::byte>(payload.begin(), payload.end())};
  TraceScope span("rendezvous", "collective");
  span.arg("bytes", static_cast<int64_t>(payload.size()));
  rounds_->begin_call("rendezvous",
                      CallHeader{CallKind::kRendezvous, DType::kBool, ReduceOp::kSum, 0, 0});
  const detail::CallEnd end(*rounds_);
  return detail::rendezvous(*rounds_, tag, payload);
}

}  // namespace xs
