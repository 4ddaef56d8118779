#include "collectives/shm_communicator.h"

#include <cstring>

#include <fmt/format.h>

#include "base/check.h"
#include "collectives/detail/rounds.h"
#include "collectives/detail/schedules.h"
#include "collectives/reduce.h"
#include "shm/wait.h"

namespace xs {
namespace {

using detail::CallHeader;
using detail::CallKind;

// Largest tag + payload a rendezvous carries: it must fit one staging half with its lengths.
size_t rendezvous_capacity(const detail::Rounds& rounds) {
  return rounds.half_bytes() - 2 * sizeof(uint64_t);
}

}  // namespace

ShmCommunicator::ShmCommunicator(Segment segment, ShmCommunicatorOptions options)
    : forced_(options.algorithm ? options.algorithm : all_reduce_algorithm_from_env()) {
  const int64_t timeout_ms = options.timeout_ms.value_or(collective_timeout_ms_from_env());
  XS_CHECK_ARG(timeout_ms > 0, "ShmCommunicator: timeout {} ms must be positive", timeout_ms);
  rounds_ = std::make_unique<detail::Rounds>(std::move(segment), timeout_ms);
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

AllReduceAlgorithm ShmCommunicator::all_reduce_algorithm(size_t n_bytes) const {
  const AllReduceAlgorithm chosen =
      forced_ ? *forced_
              : choose_all_reduce_algorithm(n_bytes, world_size(), segment().spin_allowed());
  // CMA that turned out not to be permitted runs as the staging two-shot.
  if (chosen == AllReduceAlgorithm::kCma && cma_ == false) return AllReduceAlgorithm::kTwoShot;
  return chosen;
}

void ShmCommunicator::all_reduce(void* data, size_t n_elems, DType dtype, ReduceOp op) {
  check_reducible("all_reduce", dtype);
  XS_CHECK_ARG(data != nullptr || n_elems == 0, "all_reduce: null buffer for {} elements", n_elems);
  if (world_size() == 1) return;  // sum, mean, max and min of one replica: the input
  rounds_->begin_call("all_reduce", CallHeader{CallKind::kAllReduce, dtype, op, n_elems, 0});
  auto* bytes = static_cast<std::byte*>(data);
  switch (all_reduce_algorithm(n_elems * dtype_size(dtype))) {
    case AllReduceAlgorithm::kOneShot:
      return detail::all_reduce_one_shot(*rounds_, bytes, n_elems, dtype, op);
    case AllReduceAlgorithm::kTwoShot:
      return detail::all_reduce_two_shot(*rounds_, bytes, n_elems, dtype, op);
    case AllReduceAlgorithm::kRing:
      return detail::all_reduce_ring(*rounds_, bytes, n_elems, dtype, op);
    case AllReduceAlgorithm::kCma:
      if (!cma_) cma_ = detail::negotiate_cma(*rounds_);
      if (*cma_) return detail::all_reduce_cma(*rounds_, bytes, n_elems, dtype, op);
      return detail::all_reduce_two_shot(*rounds_, bytes, n_elems, dtype, op);
  }
}

void ShmCommunicator::broadcast(void* data, size_t n_elems, DType dtype, int root) {
  XS_CHECK_ARG(root >= 0 && root < world_size(), "broadcast: root {} outside 0..{}", root,
               world_size() - 1);
  XS_CHECK_ARG(data != nullptr || n_elems == 0, "broadcast: null buffer for {} elements", n_elems);
  if (world_size() == 1) return;
  rounds_->begin_call("broadcast",
                      CallHeader{CallKind::kBroadcast, dtype, ReduceOp::kSum, n_elems, root});
  detail::broadcast(*rounds_, static_cast<std::byte*>(data), n_elems * dtype_size(dtype), root);
}

void ShmCommunicator::all_gather(const void* in, void* out, size_t n_elems, DType dtype) {
  const size_t bytes = n_elems * dtype_size(dtype);
  if (world_size() == 1) {
    if (bytes != 0 && in != out) std::memmove(out, in, bytes);
    return;
  }
  rounds_->begin_call("all_gather",
                      CallHeader{CallKind::kAllGather, dtype, ReduceOp::kSum, n_elems, 0});
  detail::all_gather(*rounds_, static_cast<const std::byte*>(in), static_cast<std::byte*>(out),
                     bytes);
}

void ShmCommunicator::reduce_scatter(const void* in, void* out, size_t n_elems, DType dtype,
                                     ReduceOp op) {
  check_reducible("reduce_scatter", dtype);
  if (world_size() == 1) {
    const void* sources[] = {in};
    reduce_sources(out, nullptr, sources, 1, n_elems, dtype, op, 1);
    return;
  }
  rounds_->begin_call("reduce_scatter",
                      CallHeader{CallKind::kReduceScatter, dtype, op, n_elems, 0});
  detail::reduce_scatter(*rounds_, static_cast<const std::byte*>(in), static_cast<std::byte*>(out),
                         n_elems, dtype, op);
}

void ShmCommunicator::barrier() {
  if (world_size() == 1) return;
  rounds_->begin_call("barrier", CallHeader{});
  rounds_->sync();
}

std::vector<std::vector<std::byte>> ShmCommunicator::rendezvous(
    const std::string& tag, std::span<const std::byte> payload) {
  XS_CHECK_ARG(tag.size() + payload.size() <= rendezvous_capacity(*rounds_),
               "rendezvous '{}': tag and payload take {} bytes, at most {} fit the staging", tag,
               tag.size() + payload.size(), rendezvous_capacity(*rounds_));
  if (world_size() == 1) return {std::vector<std::byte>(payload.begin(), payload.end())};
  rounds_->begin_call("rendezvous",
                      CallHeader{CallKind::kRendezvous, DType::kBool, ReduceOp::kSum, 0, 0});
  return detail::rendezvous(*rounds_, tag, payload);
}

}  // namespace xs
