#pragma once
// Kernel entry points used by the program executor. Every non-elementwise op has one
// function here; elementwise ops run through the blocked loop interpreter (kernels/loop.h).
// Buffers are contiguous row-major; `out` never aliases an input unless the op is marked
// in-place capable by the planner (reshape, all_reduce).

#include <memory>
#include <span>
#include <string>

#include "xla_spawn/runtime/op.h"

namespace xs {
class Communicator;
class Metrics;
}  // namespace xs

namespace xs::detail {

struct Arg {
  void* data;
  const ValueType* type;
};

// Memory for the operands of in-graph all-reduces, from the communicator's buffer arena, so
// the collective can run its zero-copy schedule. Contents need not survive between runs.
class CollectiveScratch {
 public:
  virtual ~CollectiveScratch() = default;
  // The `index`-th operand buffer of the running program, at least `bytes` long.
  virtual void* get(int index, size_t bytes) = 0;
};

struct ExecEnv {
  Communicator* communicator = nullptr;
  Metrics* metrics = nullptr;
  CollectiveScratch* scratch = nullptr;  // null: all-reduce operands stay in the program's arena
};

// An op's kernel made ready for its attributes and operand types when the program is compiled
// (today: oneDNN primitives for bf16 matmul and convolution, kernels/onednn.h) and held by the
// program's Kernel, so nothing is built per run. Immutable once made; run may be called from
// any thread.
class PreparedKernel {
 public:
  virtual ~PreparedKernel() = default;
  virtual void run(std::span<const Arg> ins, const Arg& out) const = 0;
  // What runs, for Program::text (e.g. "onednn brg:avx512_core_bf16").
  virtual std::string text() const = 0;
};

// The prepared form of a non-elementwise op, or null when run_op_kernel runs it as it is.
std::shared_ptr<const PreparedKernel> prepare_op_kernel(Op op, const Attrs& attrs,
                                                        std::span<const ValueType> ins,
                                                        const ValueType& out);

// Whether a convolution (conv2d and its gradients) over `in_channels` input channels runs on
// oneDNN in f32: from 16 input channels, unless XLA_SPAWN_CONV=runtime (read per call). The
// compiler leaves such convolutions unfused (passes.h), since oneDNN runs the plain ops.
bool onednn_runs_f32_conv(int64_t in_channels);

// Runs a non-elementwise op (also kConst: a fill) by its plain kernel; a program runs the
// prepared form instead where prepare_op_kernel made one. Throws InvalidArgument for bad runtime
// values (an index out of range), naming the op and the value.
void run_op_kernel(Op op, const Attrs& attrs, std::span<const Arg> ins, const Arg& out,
                   const ExecEnv& env);

void fill_kernel(double value, const Arg& out);
void reduce_kernel(Op op, const Attrs& attrs, const Arg& in, const Arg& out);
void argmax_kernel(const Attrs& attrs, const Arg& in, const Arg& out);
void permute_kernel(const Attrs& attrs, const Arg& in, const Arg& out);
void slice_kernel(const Attrs& attrs, const Arg& in, const Arg& out);
void concat_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out);
void broadcast_kernel(const Arg& in, const Arg& out);
void pad_kernel(const Attrs& attrs, const Arg& in, const Arg& out);
void matmul_kernel(const Attrs& attrs, const Arg& a, const Arg& b, const Arg& out);
// What mark_causal_products (passes.h) proved about a float matmul whose last two dims are a
// causal attention's square T x T, as flag bits above the transposes; at most one is set. Each
// only lets the kernel skip work, so a kernel that ignores them (oneDNN's bf16 primitive) is
// still right. The kernel works in row blocks of kCausalBlock:
//   kMatmulCausalOut: only out[.., i, j] with j <= i is read (by a causal softmax or its
//     gradient): a row block computes the columns up to its last row and zeroes the rest.
//   kMatmulLowerA: a, as multiplied, is zero above the diagonal (a causal softmax's
//     probabilities or their gradient): a row block's inner dimension stops at its last row.
//   kMatmulUpperA: a, as multiplied, is zero below the diagonal (the same, transposed): a row
//     block's inner dimension starts at its first row.
// Skipped terms are zeros times the other operand: where that operand is finite they add
// nothing, so the sums are the full product's (up to rounding order and the sign of an exact
// zero); a NaN or infinity in it no longer spreads through the masked terms, beyond the rows
// of its own block. matmul_kernel runs the blocks on the BLAS, matrix by matrix; f32 ones with
// batch dims are prepared on oneDNN instead (make_onednn_causal_matmul), one call per block
// for the whole batch.
inline constexpr int64_t kMatmulCausalOut = 4, kMatmulLowerA = 8, kMatmulUpperA = 16;
inline constexpr int64_t kCausalBlock = 32;
// What the row block from row r0 of a t x t causal product computes: rows [r0, r0 + rows),
// inner range [p0, p1) of k, columns [0, cols) of n (a causal output: zeros from cols on).
struct CausalBlock {
  int64_t r0, rows, p0, p1, cols;
};
inline CausalBlock causal_block(int64_t structure, int64_t r0, int64_t t, int64_t k, int64_t n) {
  const int64_t r1 = r0 + kCausalBlock < t ? r0 + kCausalBlock : t;
  return {r0, r1 - r0, structure == kMatmulUpperA ? r0 : 0, structure == kMatmulLowerA ? r1 : k,
          structure == kMatmulCausalOut ? r1 : n};
}
// ins = {a, b, c, beta}: out = op(a) op(b) + beta * c (2-D f32/f64; out may be c's storage).
void matmul_accumulate_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out);
// ins = {x, w}, or {x, w, bias} (compiler-made, 2x2 pool attrs after the conv's): out =
// [2][N][O][OH/2][OW/2], the pooled relu(conv + bias) values, then each window's argmax (0..3).
void conv2d_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out);
// ins = {x}, or for max_pool2d {x, bias} (made by the compiler): relu(max_pool2d(x) + bias[c]).
void pool2d_kernel(Op op, const Attrs& attrs, std::span<const Arg> ins, const Arg& out);
// ins = {grad_out, w} or, made by the compiler, {h, w, y} / {h, w, y, bias}: grad_out is then
// max_pool2d_grad(y, h[, bias]) with the pool attrs in attrs.ints[6..12), formed one sample at
// a time in scratch and never stored whole; or {h, w, f} with f a fused conv2d's result: h
// routed by f's argmax positions.
void conv2d_grad_input_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out);
// ins = {x, grad_out} or {x, h, y} / {x, h, y, bias}, grad_out as above.
void conv2d_grad_weight_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out);
void pool2d_grad_kernel(Op op, const Attrs& attrs, std::span<const Arg> ins, const Arg& out);
// One sample's max-pool gradient: out[channels][h][w] = max_pool2d_grad(y, g[, bias]) with
// pool attrs `pool` (6 ints: kernel, stride, padding), as pool2d_grad_kernel computes it.
template <typename T>
void max_pool2d_grad_planes(const int64_t* pool, const T* y, const T* g, const T* bias,
                            int64_t channels, int64_t h, int64_t w, T* out);
// One sample's 2x2 / stride 2 max pool of relu(y + bias[c]) over even planes [channels][h][w]:
// val = the window maxima, idx = the row-major position (0..3) of each first maximum.
template <typename T>
void max_pool2d_argmax_planes(const T* y, const T* bias, int64_t channels, int64_t h, int64_t w,
                              T* val, T* idx);
// Its gradient: out[channels][h][w] = g at each window's idx, 0 elsewhere.
template <typename T>
void max_pool2d_route_planes(const T* idx, const T* g, int64_t channels, int64_t h, int64_t w, T* out);
void scatter_add_kernel(const Attrs& attrs, const Arg& index, const Arg& src, const Arg& out);
void gather_kernel(const Attrs& attrs, const Arg& x, const Arg& index, const Arg& out);
void one_hot_kernel(const Attrs& attrs, const Arg& index, const Arg& out);
void embedding_kernel(const Arg& table, const Arg& index, const Arg& out);
void embedding_grad_kernel(const Arg& index, const Arg& grad, const Arg& out);
void layer_norm_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out);
void layer_norm_grad_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out);
// softmax (x) or softmax_grad (y, grad_y).
void softmax_kernel(const Attrs& attrs, std::span<const Arg> ins, const Arg& out);
void random_kernel(Op op, const Attrs& attrs, std::span<const Arg> ins, const Arg& out);

// The runtime's row-major single-precision GEMM (OpenBLAS, or oneDNN for large products):
// c[m x n] = op(a) * op(b), leading dimensions = row lengths of the stored matrices.
void gemm_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b,
              float* c);

// Pins OpenBLAS to one thread (one replica per core). Idempotent.
void init_blas_threads();

}  // namespace xs::detail
