#include "xla_spawn/collectives/node_topology.h"

#include <algorithm>

#include "xla_spawn/base/check.h"

namespace xs {

NodeTopology::NodeTopology(std::vector<int> node_sizes, int node, int local_ordinal)
    : node_sizes_(std::move(node_sizes)), node_(node), local_ordinal_(local_ordinal) {
  XS_CHECK_ARG(!node_sizes_.empty() && node_sizes_.size() <= static_cast<size_t>(kMaxNodes),
               "node topology: {} nodes, expected 1..{}", node_sizes_.size(), kMaxNodes);
  first_.reserve(node_sizes_.size() + 1);
  first_.push_back(0);
  for (size_t h = 0; h < node_sizes_.size(); ++h) {
    XS_CHECK_ARG(node_sizes_[h] >= 1 && node_sizes_[h] <= kMaxNodeSize,
                 "node topology: node {} has {} replicas, expected 1..{}", h, node_sizes_[h],
                 kMaxNodeSize);
    first_.push_back(first_.back() + node_sizes_[h]);
  }
  XS_CHECK_ARG(node_ >= 0 && node_ < nnodes(), "node topology: node {} outside 0..{}", node_,
               nnodes() - 1);
  XS_CHECK_ARG(local_ordinal_ >= 0 && local_ordinal_ < node_sizes_[node_],
               "node topology: local ordinal {} outside 0..{} (node {} has {} replicas)",
               local_ordinal_, node_sizes_[node_] - 1, node_, node_sizes_[node_]);
}

int NodeTopology::node_of(int ordinal) const {
  XS_CHECK_ARG(ordinal >= 0 && ordinal < world_size(), "node topology: ordinal {} outside 0..{}",
               ordinal, world_size() - 1);
  return static_cast<int>(std::upper_bound(first_.begin(), first_.end(), ordinal) -
                          first_.begin()) -
         1;
}

}  // namespace xs
