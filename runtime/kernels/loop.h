#pragma once
// The blocked elementwise interpreter: one fused loop over the output elements, run in
// blocks of kLoopBlock so every intermediate stays in L1 while a chain of ops is applied.
// A loop loads its inputs (contiguous, broadcast or constant), applies its steps register to
// register, and stores the values used outside the loop. It is safe in place: every element
// of a block is loaded before any element of that block is stored, and a contiguous input is
// only read at the positions its output writes.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "xla_spawn/runtime/op.h"

namespace xs::detail {

inline constexpr int64_t kLoopBlock = 256;  // 256 x 8 bytes = 2 KiB per register: ~20 fit L1

// Computes n elements: out = f(a, b, c) on arrays of the step's compute type.
using BlockFn = void (*)(void* out, const void* a, const void* b, const void* c, int64_t n);

struct LoopLoad {
  int reg;
  int storage = -1;       // -1: a constant
  DType dtype;            // stored dtype
  Shape shape;            // the operand's own shape (broadcast to the loop's shape)
  double constant = 0;
  bool index = false;     // no operand: element j's flat index j (an i64), for random steps
};

struct LoopStep {
  Op op;
  BlockFn fn;
  int out;
  int in[3] = {-1, -1, -1};
};

struct LoopStore {
  int reg;
  int storage;
  DType dtype;
};

// A reduction of one register over some of the loop's axes, out = `outer` values of `dtype`
// (the register's float dtype; kI64 for argmax) written to `storage`. The orders are
// reduce_kernel's and argmax_kernel's, so a reduction gives the same bits fused or on its own:
// values widened to double (a bf16 register rounded to bf16 first, as it would be stored), a
// mean is the sum divided by `reduced`, one rounding to `dtype` at the end.
// - Over one contiguous run of axes (`axes` empty) the loop's shape is read as [outer,
//   reduced, inner], out[o, i] = op over r of reg[o, r, i] (outer x inner values), each
//   written as it is complete: a sum over a whole run (inner == 1) in row_sum.h's lanes,
//   otherwise per i in r order from 0.0; max and min in r order from the first value, taking
//   v when v > acc (v < acc) or v is NaN; argmax scans as max does but takes v when v > acc
//   or v is the first NaN (torch's and numpy's argmax: the first NaN's index), and gives that
//   value's r.
// - Over any other axes (`axes`, sorted: a conv bias gradient's or a batch norm's [0, 2, 3]
//   of NCHW), o numbers the kept axes' coordinates and r the reduced axes' (each row-major),
//   `outer` and `reduced` count them (inner == 1): a sum adds r into lane r % 16 (lanes
//   from 0.0, added in lane order at the end, as row_sum does over r), max and min scan in r
//   order as above; every value is written once the loop's last element is in. Not argmax
//   (one axis is always a run).
struct LoopReduce {
  Op op;  // kSum, kMean, kMax, kMin, kArgmax
  int reg;
  int storage;
  DType dtype;
  int64_t outer = 1, reduced = 1, inner = 1;
  std::vector<int64_t> axes;  // the general form's reduced axes; empty: one contiguous run
};

struct LoopKernel {
  Shape shape;
  std::vector<DType> reg_dtype;  // value dtype per register (compute type derives from it)
  std::vector<LoopLoad> loads;
  std::vector<LoopStep> steps;
  std::vector<LoopStore> stores;
  std::optional<LoopReduce> reduce;
};

// How a load reads its operand for loop element j (the interpreter and the generated code
// share this classification).
// kFixed: a constant or a one-element operand, the same value for every j.
// kDirect / kConvert: the operand has the loop's shape: element j (kConvert: bf16, widened).
// kTile: the operand is the loop's trailing dims (a bias row): element j is src[j % period].
// kSpread: the operand is the loop's leading dims then 1s (a per-row max): src[j / period].
// kRun: the operand is one run of the loop's middle dims, 1s around it (a conv bias
// [1, C, 1, 1]): element j is src[(j / period) % count], constant over runs of `period`.
// kBroadcast: any other broadcast, element by element through the operand's strides.
// kIndex: the element's flat index j itself (LoopLoad::index).
enum class LoadMode { kFixed, kDirect, kConvert, kTile, kSpread, kRun, kBroadcast, kIndex };

struct LoadPlan {
  LoadMode mode;
  int64_t period = 1;
  int64_t count = 1;
};

LoadPlan load_plan(const LoopLoad& load, const Shape& loop_shape);

// The block function of elementwise `op` whose operands have dtype `in` (where: the value
// dtype) producing `out`.
BlockFn elementwise_block_fn(Op op, DType in, DType out);

// The block function of a random op (kRandom) with result dtype `out`: out = random.h's value
// for (seed a, flat index b, p c: f32, bernoulli only) in the result's compute type, rounded
// to bf16 for a bf16 result (so readers in the loop see the value the op kernel stores).
BlockFn random_block_fn(Op op, DType out);
void run_loop(const LoopKernel& loop, void* const* storage);
// The [outer, reduced, inner] form of reducing `shape` over `axes` (sorted), when they are one
// contiguous non-empty run.
std::optional<LoopReduce> reduce_form(const Shape& shape, const std::vector<int64_t>& axes);
// That form, else the general one (LoopReduce::axes), for any non-empty sorted `axes`.
LoopReduce loop_reduce_form(const Shape& shape, const std::vector<int64_t>& axes);
// A general reduction's rows in generated code: the loop's last axes that are all reduced or
// all kept (axes of extent 1 go with either, so [N, C, 1, 1] over [0, 2, 3] has rows of C
// kept values), from `first_axis` on, `elements` per row; `reduced` says which kind.
struct ReduceRow {
  int64_t first_axis;
  int64_t elements;
  bool reduced;
};
ReduceRow general_reduce_row(const Shape& shape, const std::vector<int64_t>& axes);
// The doubles of scratch a generated loop with reduction `r` needs (NativeLoopFn's scratch).
int64_t reduce_scratch_doubles(const LoopReduce& r);
std::string loop_text(const LoopKernel& loop);

}  // namespace xs::detail
