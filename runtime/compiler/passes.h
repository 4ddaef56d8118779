#pragma once
// Graph-level compiler passes over a cut Graph: constant folding (with the identities
// x*1, x+0, x-0, x/1 and no-op casts/reshapes), common-subexpression elimination and
// dead-code elimination. Each rewrites `nodes`/`roots` and records what it did in `stats`.

#include <cstdint>
#include <vector>

#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/program.h"

namespace xs::detail {

struct Work {
  std::vector<GNode> nodes;
  std::vector<int> roots;
};

void fold_constants(Work& w, CompileStats& stats);
void eliminate_common_subexpressions(Work& w, CompileStats& stats);
void eliminate_dead_code(Work& w, CompileStats& stats);
// Rewrites add(mul(x, s), matmul(a, b)) (s 0-d, f32/f64, 2-D, each intermediate used once)
// into one accumulating GEMM, matmul(a, b, x, s) = a b + s x: the momentum update
// `buf * momentum + grad` then costs no pass of its own (the GEMM's beta), and the GEMM may
// write straight into a donated x. Run before dead-code elimination.
void fuse_gemm_accumulate(Work& w, CompileStats& stats);

// Moves a ReLU mask from the unpooled to the pooled side of a max-pool gradient, where it
// costs a quarter of the memory traffic and the mask over the activation is never stored:
//   mul(max_pool2d_grad(y, g), cast(gt(y, 0)))  ->  max_pool2d_grad(y, g * cast(gt(pool(y), 0)))
// (each window routes its gradient to its argmax, whose value is the window's pool output).
// Then a sum over both spatial axes of max_pool2d_grad(y, h) becomes the same sum of h (every
// window routes to exactly one cell): a conv bias gradient reads the pooled gradient only.
// Needs max_pool2d(y) in the graph (the forward pass made it). Run after CSE, before DCE.
void fuse_pool_grad_mask(Work& w);
// Pools before the bias and ReLU when a 2-D max pool is the only reader of relu(x + b) (b one
// value per channel, [1, C, 1, 1]), the pattern conv-bias-relu-pool:
//   max_pool2d(relu(x + b))        ->  max_pool2d(x, b) = relu(max_pool2d(x) + b), one kernel
//   max_pool2d_grad(relu(x + b), h) ->  max_pool2d_grad(x, h, b)  (recomputes relu(x + b))
// Exact (x -> relu(x + b) is monotone and rounding is monotone) except with NaNs in x, which
// then make the window's output 0 instead of being skipped. The full-size bias-and-ReLU pass
// and its stored result disappear: only the pooled quarter is touched. f32/f64 only. Run
// after fuse_pool_grad_mask (whose leftover masks it ignores as dead), before DCE.
void fuse_pool_bias_relu(Work& w);
// Hands the conv gradients the max-pool gradient's operands instead of its result, when they
// are its only readers:
//   conv2d_grad_weight(x, max_pool2d_grad(y, h[, b]))  ->  conv2d_grad_weight(x, h, y[, b])
//   conv2d_grad_input(max_pool2d_grad(y, h[, b]), w)   ->  conv2d_grad_input(h, w, y[, b])
// (pool attrs appended to the conv's). The kernels route h one sample at a time into a
// scratch that stays in cache: the full-size gradient of the conv output is never stored and
// re-read. Exact: the same routing, the same GEMMs. f32/f64, except f32 convolutions that
// oneDNN runs (onednn_runs_f32_conv: its primitive takes the plain ops only). Run after
// fuse_pool_bias_relu, before DCE (which removes the then dead max_pool2d_grad).
void fuse_conv_pool_grad(Work& w);
// The whole layer conv-bias-relu-2x2-pool as one kernel when the convolution's output y is
// read only by max_pool2d(y, b) and the conv gradients fused above (.., y, b):
//   f = conv2d(x, w, b): [2, N, C, H/2, W/2], the pooled relu(y + b) and each window's argmax
//   max_pool2d(y, b)           ->  reshape(slice(f)[0])
//   conv2d_grad_*(.., y, b)    ->  conv2d_grad_*(.., f)   (route h by f's argmax)
// y is computed one sample at a time into a scratch that stays in cache and is never stored:
// the layer's largest tensor is neither written nor read back by the pool or its gradient.
// The argmax is the one the pool gradient over relu(y + b) picks, so gradients are bit for
// bit those of fuse_conv_pool_grad; pooled values too, except that a NaN in y is now skipped
// as relu(NaN) = 0 (as unfused), instead of making its window 0. Not for f32 convolutions
// that oneDNN runs (as above). Run after fuse_conv_pool_grad.
void fuse_conv_pool_forward(Work& w);

// Causal attention's products skip the masked half (kernels.h, kMatmulCausalOut...). A float
// matmul over square T x T blocks gets
//   kMatmulCausalOut when every live reader of its value reads only j <= i: a causal softmax,
//     a causal softmax gradient as its grad_y, or a product by a 0-d value, a division by
//     one, a negation or a cast whose readers all do so in turn (attention's scores);
//   kMatmulLowerA / kMatmulUpperA when its a operand is zero above the diagonal, untransposed
//     / transposed: a causal softmax or its causal gradient, or such a value times or over a
//     0-d value, negated or cast (the probabilities, the scores' gradient).
// The masked terms are left out as zeros: a non-finite scale (or a division by zero), which
// would turn them into NaNs, or a NaN or infinity in the other operand, which 0 times would
// spread, no longer reaches the other rows as the full product would have. Run after
// dead-code elimination.
void mark_causal_products(Work& w, CompileStats& stats);

// Lowering (lower.cpp): elementwise fusion into loop kernels and matmul epilogues, then
// storage planning by liveness; `donated[i]`: graph input i may be overwritten.
void lower_graph(Work& work, const std::vector<uint8_t>& donated, Program& program);

// Its arena packing: an arena value's bytes and the groups from its first write to its last
// read (inclusive); two values may share a slot when their lifetimes do not meet. Values go
// largest first (earliest first among equal sizes), each into the slot of fewest bytes whose
// values' lifetimes all miss its own, the earliest such, else into a new slot of its size.
struct ArenaLifetime {
  size_t bytes;
  int first;
  int last;
};
struct ArenaPacking {
  std::vector<int> slot_of;        // by value
  std::vector<size_t> slot_bytes;  // by slot
};
ArenaPacking pack_arena_slots(const std::vector<ArenaLifetime>& values);

}  // namespace xs::detail
