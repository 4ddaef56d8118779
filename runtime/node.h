#pragma once
// IR nodes: immutable, shared, hashed when made. A node's hash combines its op, attributes,
// result type and operand hashes; a data leaf contributes its shape and dtype only (never the
// values), so a graph's structure, not its data, decides what gets compiled.
//
//   NodePtr x = make_data(buffer, {{128, 784}, DType::kF32});
//   NodePtr y = make_node(Op::kRelu, {x}, {});   // checks the shape rule now, at record time

#include <cstdint>
#include <memory>
#include <vector>

#include "xla_spawn/runtime/buffer.h"
#include "xla_spawn/runtime/op.h"
#include "xla_spawn/runtime/site.h"

namespace xs {

struct Node;
using NodePtr = std::shared_ptr<const Node>;

struct Node {
  Op op;
  Attrs attrs;
  std::vector<NodePtr> operands;
  ValueType type;
  uint64_t hash = 0;
  BufferPtr data;  // kData only: the materialised value
  uint64_t data_version = 0;  // kData only: data->version() when the node was made
  RecordSite site;  // who recorded it (XLA_SPAWN_IR_DEBUG=1); never part of the hash

  const Shape& shape() const { return type.shape; }
  DType dtype() const { return type.dtype; }
};

// Records `op` on `operands`: runs the shape rule (throwing InvalidArgument naming the op and
// the operand types on a mismatch), then hashes the node. make_node and make_const take the
// thread's current recording site (runtime/site.h).
NodePtr make_node(Op op, std::vector<NodePtr> operands, Attrs attrs);
NodePtr make_data(BufferPtr data, ValueType type);
// Throws xs::InvalidArgument when `node` is a kData node whose buffer a step has overwritten in
// place since (its version moved on): using it would read the new values as the old. make_node
// checks its operands; autograd's saved values reach it this way.
void check_data_current(const Node& node);
// A compile-time constant filled with `value` (its value is part of the hash).
NodePtr make_const(double value, ValueType type);

uint64_t hash_attrs(uint64_t h, const Attrs& attrs);
uint64_t hash_type(uint64_t h, const ValueType& type);

}  // namespace xs
