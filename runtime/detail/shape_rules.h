#pragma once
// Shape rules named in runtime/ops.def; each checks operand shapes/dtypes and attributes of
// a recorded op and returns its result type, or throws InvalidArgument naming the op and the
// operand types. Private to runtime/op.cpp.

#include <span>

#include "xla_spawn/runtime/op.h"

namespace xs::detail {

#define XS_DECLARE_RULE(r) ValueType r(Op op, std::span<const ValueType> in, const Attrs& attrs);
XS_DECLARE_RULE(rule_leaf)
XS_DECLARE_RULE(rule_unary_numeric)
XS_DECLARE_RULE(rule_unary_float)
XS_DECLARE_RULE(rule_unary_bool)
XS_DECLARE_RULE(rule_binary_numeric)
XS_DECLARE_RULE(rule_binary_float)
XS_DECLARE_RULE(rule_binary_bool)
XS_DECLARE_RULE(rule_compare)
XS_DECLARE_RULE(rule_where)
XS_DECLARE_RULE(rule_cast)
XS_DECLARE_RULE(rule_reduce)
XS_DECLARE_RULE(rule_argmax)
XS_DECLARE_RULE(rule_reshape)
XS_DECLARE_RULE(rule_permute)
XS_DECLARE_RULE(rule_slice)
XS_DECLARE_RULE(rule_concat)
XS_DECLARE_RULE(rule_broadcast)
XS_DECLARE_RULE(rule_pad)
XS_DECLARE_RULE(rule_matmul)
XS_DECLARE_RULE(rule_conv2d)
XS_DECLARE_RULE(rule_pool2d)
XS_DECLARE_RULE(rule_conv2d_grad_input)
XS_DECLARE_RULE(rule_conv2d_grad_weight)
XS_DECLARE_RULE(rule_max_pool2d_grad)
XS_DECLARE_RULE(rule_avg_pool2d_grad)
XS_DECLARE_RULE(rule_scatter_add)
XS_DECLARE_RULE(rule_gather)
XS_DECLARE_RULE(rule_one_hot)
XS_DECLARE_RULE(rule_embedding)
XS_DECLARE_RULE(rule_embedding_grad)
XS_DECLARE_RULE(rule_layer_norm)
XS_DECLARE_RULE(rule_layer_norm_grad)
XS_DECLARE_RULE(rule_softmax)
XS_DECLARE_RULE(rule_softmax_grad)
XS_DECLARE_RULE(rule_random)
XS_DECLARE_RULE(rule_bernoulli)
XS_DECLARE_RULE(rule_all_reduce)
// Defined in runtime/collective_ops.cpp.
XS_DECLARE_RULE(rule_reduce_scatter)
XS_DECLARE_RULE(rule_all_gather)
XS_DECLARE_RULE(rule_shard)
#undef XS_DECLARE_RULE

}  // namespace xs::detail
