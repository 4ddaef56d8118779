#include "xla_spawn/collectives/detail/hierarchy.h"

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/reduce.h"

namespace xs::detail {
namespace {

// Inside a catch handler: rethrows the exception being handled as the same xs::Error type
// with `prefix` in front of its message (anything else unchanged).
[[noreturn]] void rethrow_prefixed(const std::string& prefix) {
  try {
    throw;
  } catch (const Timeout& e) {
    throw Timeout(prefix + e.what());
  } catch (const PeerFailure& e) {
    throw PeerFailure(prefix + e.what());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(prefix + e.what());
  } catch (const IoError& e) {
    throw IoError(prefix + e.what());
  } catch (const InternalError& e) {
    throw InternalError(prefix + e.what());
  }
}

}  // namespace

void Hierarchy::locally(const std::function<void(ShmCommunicator&)>& phase) const {
  if (local == nullptr) return;
  try {
    phase(*local);
  } catch (const Error&) {
    const int first = topology.first_ordinal(topology.node());
    rethrow_prefixed(fmt::format(
        "{} on node {} (its local ordinals 0-{} are ordinals {}-{}): ", groups.call().describe(),
        topology.node(), topology.local_world_size() - 1, first,
        first + topology.local_world_size() - 1));
  }
}

std::vector<size_t> Hierarchy::my_cut(size_t n_elems, size_t elem_bytes) const {
  return node_cut(n_elems, topology.local_world_size(), elem_bytes);
}

std::vector<CutPiece> Hierarchy::my_pieces(size_t n_elems, size_t elem_bytes,
                                           std::span<const size_t> extra_cuts) const {
  return pieces_of(n_elems, elem_bytes, topology.node_sizes(), topology.node(),
                   topology.local_ordinal(), extra_cuts);
}

void Hierarchy::in_batches(std::span<const CutPiece> pieces,
                           const std::function<int(const CutPiece&)>& owner,
                           const Batch& batch) const {
  std::vector<NodeGroups::OwnedPiece> run;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const CutPiece& p = pieces[i];
    run.push_back({p.offset, p.count, owner(p)});
    const bool last = i + 1 == pieces.size() || pieces[i + 1].offset != p.offset + p.count ||
                      pieces[i + 1].holders != p.holders;
    if (last) {
      batch(p.holders, run);
      run.clear();
    }
  }
}

void divide(std::byte* data, size_t count, DType dtype, int divisor) {
  const void* sources[] = {data};
  reduce_sources(data, nullptr, sources, 1, count, dtype, ReduceOp::kMean, divisor);
}

}  // namespace xs::detail
