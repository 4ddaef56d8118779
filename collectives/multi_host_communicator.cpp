#include "xla_spawn/collectives/multi_host_communicator.h"

#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/base/trace.h"
#include "xla_spawn/collectives/detail/hierarchy.h"
#include "xla_spawn/collectives/detail/node_groups.h"
#include "xla_spawn/collectives/reduce.h"
#include "xla_spawn/shm/wait.h"

namespace xs {
namespace {

void check_local(const NodeTopology& t, const ShmCommunicator* local) {
  if (t.local_world_size() == 1) {
    XS_CHECK_ARG(local == nullptr || local->world_size() == 1,
                 "MultiHostCommunicator: node {} runs one replica, yet got a local communicator "
                 "of world size {}",
                 t.node(), local == nullptr ? 0 : local->world_size());
    return;
  }
  XS_CHECK_ARG(local != nullptr,
               "MultiHostCommunicator: node {} runs {} replicas but got no local communicator",
               t.node(), t.local_world_size());
  XS_CHECK_ARG(local->ordinal() == t.local_ordinal() && local->world_size() == t.local_world_size(),
               "MultiHostCommunicator: the local communicator is ordinal {} of {}, the topology "
               "says local ordinal {} of {} on node {}",
               local->ordinal(), local->world_size(), t.local_ordinal(), t.local_world_size(),
               t.node());
}

}  // namespace

MultiHostCommunicator::MultiHostCommunicator(NodeTopology topology,
                                             std::unique_ptr<ShmCommunicator> local,
                                             std::shared_ptr<gloo::rendezvous::Store> store,
                                             const std::string& address,
                                             MultiHostCommunicatorOptions options)
    : topology_(std::move(topology)), local_(std::move(local)) {
  check_local(topology_, local_.get());
  XS_CHECK_ARG(store != nullptr, "MultiHostCommunicator: no rendezvous store");
  XS_CHECK_ARG(!address.empty(), "MultiHostCommunicator: empty address for node {}",
               topology_.node());
  const int64_t timeout_ms = options.timeout_ms.value_or(collective_timeout_ms_from_env());
  XS_CHECK_ARG(timeout_ms > 0, "MultiHostCommunicator: timeout {} ms must be positive", timeout_ms);
  groups_ = std::make_unique<detail::NodeGroups>(topology_, std::move(store), address,
                                                 std::move(options.prefix), timeout_ms);
  if (topology_.local_world_size() == 1) recorder_ = std::move(local_);
  if (ShmCommunicator* records = records_holder()) {
    groups_->set_phase_hook([records](const detail::CallInfo* call) {
      if (call == nullptr) return records->network_phase_done();
      records->network_phase(call->name, call->dtype, call->n_elems);
    });
  }
}

MultiHostCommunicator::~MultiHostCommunicator() {
  if (scratch_ != nullptr) free_buffer(scratch_);
}

double MultiHostCommunicator::network_seconds() const {
  return groups_->network_seconds();
}

size_t MultiHostCommunicator::group_contexts() const {
  return groups_->context_count();
}
double MultiHostCommunicator::connect_seconds() const {
  return groups_->connect_seconds();
}

void* MultiHostCommunicator::alloc_buffer(size_t bytes) {
  return local_ ? local_->alloc_buffer(bytes) : Communicator::alloc_buffer(bytes);
}

void MultiHostCommunicator::free_buffer(void* data) {
  if (local_) return local_->free_buffer(data);
  Communicator::free_buffer(data);
}

bool MultiHostCommunicator::register_buffer(void* data, size_t bytes) {
  return local_ && local_->register_buffer(data, bytes);
}

void MultiHostCommunicator::deregister_buffer(void* data) {
  if (local_) local_->deregister_buffer(data);
}

void MultiHostCommunicator::run(const detail::CallInfo& call,
                                const std::function<void(const detail::Hierarchy&)>& body) {
  if (broken_) {
    throw PeerFailure(fmt::format("{}: communicator unusable after an earlier failure: {}",
                                  call.describe(), *broken_));
  }
  groups_->set_call(call);
  TraceScope span(call.name, "collective");
  if (call.dtype) span.arg("bytes", static_cast<int64_t>(call.n_elems * dtype_size(*call.dtype)));
  span.arg("schedule", "hierarchical");
  try {
    body(detail::Hierarchy{topology_, local_.get(), *groups_});
  } catch (const std::exception& e) {
    fail(e.what());
    throw;
  }
}

// Peers blocked on this replica must not wait out their timeout: those on other nodes see
// the connections close, those on this node see the segment poisoned.
void MultiHostCommunicator::fail(const std::string& reason) noexcept {
  if (!broken_) broken_ = reason;
  groups_->close_all();
  // A node of one replica poisons its records' segment too: the launcher reads the reason
  // (a timeout gets the hang report).
  ShmCommunicator* node = records_holder();
  if (node == nullptr) return;
  try {
    node->segment().poison(reason);
  } catch (const std::exception&) {  // best effort: the failure itself is being reported
  }
}

std::byte* MultiHostCommunicator::scratch(size_t n_bytes) {
  if (n_bytes > scratch_bytes_) {
    if (scratch_ != nullptr) free_buffer(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    scratch_ = static_cast<std::byte*>(alloc_buffer(n_bytes));
    scratch_bytes_ = n_bytes;
  }
  return scratch_;
}

std::byte* MultiHostCommunicator::operand_for(void* data, size_t n_bytes, bool copy_in) {
  if (local_ == nullptr || n_bytes == 0 || local_->in_arena(data, n_bytes)) {
    return static_cast<std::byte*>(data);
  }
  std::byte* staged = scratch(n_bytes);
  if (copy_in) std::memcpy(staged, data, n_bytes);
  return staged;
}

void MultiHostCommunicator::all_reduce(void* data, size_t n_elems, DType dtype, ReduceOp op) {
  check_reducible("all_reduce", dtype, op);
  check_operand("all_reduce", data, n_elems, dtype, 1);
  run({"all_reduce", dtype, n_elems}, [&](const detail::Hierarchy& h) {
    const size_t n_bytes = n_elems * dtype_size(dtype);
    std::byte* operand = operand_for(data, n_bytes, /*copy_in=*/true);
    detail::multi_host_all_reduce(h, operand, n_elems, dtype, op);
    if (operand != data) std::memcpy(data, operand, n_bytes);
  });
}

// The root's node broadcasts locally, which takes operands anywhere; only the other nodes'
// local gather wants the arena.
void MultiHostCommunicator::broadcast(void* data, size_t n_elems, DType dtype, int root) {
  XS_CHECK_ARG(root >= 0 && root < world_size(), "broadcast: root {} outside 0..{}", root,
               world_size() - 1);
  check_operand("broadcast", data, n_elems, dtype, 1);
  run({"broadcast", dtype, n_elems}, [&](const detail::Hierarchy& h) {
    const size_t n_bytes = n_elems * dtype_size(dtype);
    const bool root_node = topology_.node_of(root) == topology_.node();
    std::byte* operand =
        root_node ? static_cast<std::byte*>(data) : operand_for(data, n_bytes, /*copy_in=*/false);
    detail::multi_host_broadcast(h, operand, n_elems, dtype, root);
    if (operand != data) std::memcpy(data, operand, n_bytes);
  });
}

void MultiHostCommunicator::all_gather(const void* in, void* out, size_t n_elems, DType dtype) {
  check_operand("all_gather", in, n_elems, dtype, 1);
  check_operand("all_gather", out, n_elems, dtype, world_size());
  check_chunk_overlap("all_gather", in, n_elems * dtype_size(dtype), out, world_size(), ordinal());
  run({"all_gather", dtype, n_elems}, [&](const detail::Hierarchy& h) {
    const size_t out_bytes = n_elems * dtype_size(dtype) * static_cast<size_t>(world_size());
    std::byte* operand = operand_for(out, out_bytes, /*copy_in=*/false);
    detail::multi_host_all_gather(h, static_cast<const std::byte*>(in), operand, n_elems, dtype);
    if (operand != out) std::memcpy(out, operand, out_bytes);
  });
}

// The schedule reduces in place, so it always works on a copy of the input.
void MultiHostCommunicator::reduce_scatter(const void* in, void* out, size_t n_elems, DType dtype,
                                           ReduceOp op) {
  check_reducible("reduce_scatter", dtype, op);
  check_operand("reduce_scatter", in, n_elems, dtype, world_size());
  check_operand("reduce_scatter", out, n_elems, dtype, 1);
  check_chunk_overlap("reduce_scatter", out, n_elems * dtype_size(dtype), in, world_size(),
                      ordinal());
  run({"reduce_scatter", dtype, n_elems}, [&](const detail::Hierarchy& h) {
    const size_t in_bytes = n_elems * dtype_size(dtype) * static_cast<size_t>(world_size());
    std::byte* work = scratch(in_bytes);
    if (in_bytes != 0) std::memcpy(work, in, in_bytes);
    detail::multi_host_reduce_scatter(h, work, static_cast<std::byte*>(out), n_elems, dtype, op);
  });
}

// Local barrier, the leaders' gloo barrier, local barrier: no replica leaves before every
// replica of every node has arrived.
void MultiHostCommunicator::barrier() {
  run({"barrier", std::nullopt, 0}, [&](const detail::Hierarchy& h) {
    h.locally([](ShmCommunicator& local) { local.barrier(); });
    if (topology_.local_ordinal() == 0) {
      groups_->barrier(std::vector<int>(static_cast<size_t>(topology_.nnodes()), 0));
    }
    h.locally([](ShmCommunicator& local) { local.barrier(); });
  });
}

std::vector<std::vector<std::byte>> MultiHostCommunicator::rendezvous(
    const std::string& tag, std::span<const std::byte> payload) {
  detail::RendezvousResult result;
  run({"rendezvous", std::nullopt, 0},
      [&](const detail::Hierarchy& h) { result = detail::multi_host_rendezvous(h, tag, payload); });
  if (!result.mismatch.empty()) throw PeerFailure(result.mismatch);
  return std::move(result.payloads);
}

}  // namespace xs
