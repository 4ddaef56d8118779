#include "xla_spawn/runtime/node.h"

#include "xla_spawn/runtime/shape.h"

#include "xla_spawn/runtime/hash.h"

namespace xs {

uint64_t hash_attrs(uint64_t h, const Attrs& attrs) {
  h = hash_combine(h, attrs.ints.size());
  for (int64_t v : attrs.ints) h = hash_combine(h, static_cast<uint64_t>(v));
  h = hash_double(h, attrs.scalar);
  h = hash_combine(h, static_cast<uint64_t>(attrs.dtype));
  return hash_combine(h, static_cast<uint64_t>(attrs.flag));
}

uint64_t hash_type(uint64_t h, const ValueType& type) {
  h = hash_combine(h, static_cast<uint64_t>(type.dtype));
  h = hash_combine(h, type.shape.size());
  for (int64_t d : type.shape) h = hash_combine(h, static_cast<uint64_t>(d));
  return h;
}

void check_data_current(const Node& node) {
  if (node.op != Op::kData || node.data == nullptr || node.data_version == node.data->version()) {
    return;
  }
  throw InvalidArgument(fmt::format(
      "a {} value recorded before a step updated it in place is used after that step, which "
      "would read the new values (for example: backward() through a loss recorded before "
      "mark_step() ran an optimizer step or an assign() on one of its inputs); record it again "
      "after the update",
      type_str(node.type)));
}

NodePtr make_node(Op op, std::vector<NodePtr> operands, Attrs attrs) {
  std::vector<ValueType> types;
  types.reserve(operands.size());
  for (const NodePtr& o : operands) {
    check_data_current(*o);
    types.push_back(o->type);
  }
  auto node = std::make_shared<Node>();
  node->type = infer_type(op, types, attrs);
  numel(node->type.shape);  // refuses a negative dimension or an overflowing element count
  uint64_t h = hash_combine(kHashSeed, static_cast<uint64_t>(op));
  h = hash_attrs(h, attrs);
  for (const NodePtr& o : operands) h = hash_combine(h, o->hash);
  node->hash = h;
  node->op = op;
  node->attrs = std::move(attrs);
  node->operands = std::move(operands);
  node->site = detail::current_site();
  return node;
}

NodePtr make_data(BufferPtr data, ValueType type) {
  auto node = std::make_shared<Node>();
  node->op = Op::kData;
  node->data_version = data != nullptr ? data->version() : 0;
  node->hash = hash_type(hash_combine(kHashSeed, static_cast<uint64_t>(Op::kData)), type);
  node->type = std::move(type);
  node->data = std::move(data);
  return node;
}

NodePtr make_const(double value, ValueType type) {
  numel(type.shape);  // as in make_node
  auto node = std::make_shared<Node>();
  node->op = Op::kConst;
  node->attrs.scalar = value;
  uint64_t h = hash_combine(kHashSeed, static_cast<uint64_t>(Op::kConst));
  node->hash = hash_type(hash_attrs(h, node->attrs), type);
  node->type = std::move(type);
  node->site = detail::current_site();
  return node;
}

}  // namespace xs
