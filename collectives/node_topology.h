#pragma once
// The shape of a job that spans several nodes (hosts): how many replicas each node runs, and
// where this replica sits. Global ordinals are dense and ordered by node: node h's replicas
// are ordinals first_ordinal(h) .. first_ordinal(h) + node_size(h) - 1, and a replica's local
// ordinal is its index within its node (its ordinal in the node's shared-memory segment).
//
//   xs::NodeTopology topology({2, 1, 3}, /*node=*/2, /*local_ordinal=*/1);
//   topology.ordinal();     // 4 = first_ordinal(2) + 1
//   topology.world_size();  // 6
//   topology.node_of(2);    // 1

#include <vector>

namespace xs {

class NodeTopology {
 public:
  // Replicas per node: as many as one shared-memory segment serves.
  static constexpr int kMaxNodeSize = 1024;
  // Nodes per job; with kMaxNodeSize the world size stays far inside an int.
  static constexpr int kMaxNodes = 65536;

  // Throws xs::InvalidArgument naming the values unless there are 1..kMaxNodes nodes of
  // 1..kMaxNodeSize replicas each, `node` is one of them and `local_ordinal` one of its
  // replicas.
  NodeTopology(std::vector<int> node_sizes, int node, int local_ordinal);

  const std::vector<int>& node_sizes() const { return node_sizes_; }
  int nnodes() const { return static_cast<int>(node_sizes_.size()); }
  // This replica's node and its index there.
  int node() const { return node_; }
  int local_ordinal() const { return local_ordinal_; }
  int local_world_size() const { return node_size(node_); }
  int ordinal() const { return first_ordinal(node_) + local_ordinal_; }
  int world_size() const { return first_.back(); }

  // Replicas on node `node` (0 .. nnodes() - 1) and the ordinal of the first of them.
  int node_size(int node) const { return node_sizes_[node]; }
  int first_ordinal(int node) const { return first_[node]; }
  // The node that runs `ordinal`; throws xs::InvalidArgument outside 0 .. world_size() - 1.
  int node_of(int ordinal) const;

 private:
  std::vector<int> node_sizes_;
  std::vector<int> first_;  // first_[h]: first ordinal of node h; first_[nnodes()]: world size
  int node_;
  int local_ordinal_;
};

}  // namespace xs
