// Generated loop code against the interpreter, bit for bit (issue 16, acceptance 4): the walk
// covers every elementwise op of runtime/ops.def on every dtype its shape rule accepts, at
// sizes around the vector width (0, 1, 7, 15, 16, 17, 100) and in each broadcast form the
// generator handles (a scalar, a bias row, a per-row value, a conv-style middle run), with
// values at the edges: NaN, infinities, -0, denormals, bf16 rounding ties, zero divisors,
// and a general broadcast (gathered through its strides in generated code). The random
// ops, which loops compute from the element's index, are checked against their op kernel, and
// the reductions that join a loop against the reduction kernel.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/element.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/buffer.h"
#include "xla_spawn/runtime/compiler/compile.h"
#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/kernels/kernels.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/program.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

// The environment's runtime options, with native code on or off.
RuntimeOptions codegen_options(bool codegen) {
  RuntimeOptions options = RuntimeOptions::from_env();
  options.codegen = codegen;
  return options;
}

constexpr DType kDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64, DType::kBool};

// Element i of operand `salt`: cycles through edge values, offset per operand so binary ops
// meet every pairing (including x op x, NaN op NaN, and 0 divisors).
double edge_value(DType dtype, int64_t i, int salt) {
  static const double kFloats[] = {0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.140625, 1e30, -1e30,
                                   INFINITY, -INFINITY, NAN, 1e-40, 100.0, -100.0, 0.1, 88.7, -88.7,
                                   1.00390625 /* a bf16 tie */, 1.01171875 /* another */, 7.0, -7.25, 2.0, 1e-3};
  static const double kInts[] = {0, 1, -1, 2, -3, 7, 100, -100, 39999, -40000, 5, 12, -12, 3, -2147483648.0};
  const int64_t k = i * 7 + salt * 5 + i / 3;
  switch (dtype) {
    case DType::kF32: case DType::kF64: case DType::kBF16: return kFloats[k % std::size(kFloats)];
    case DType::kI32: case DType::kI64: return kInts[k % std::size(kInts)];
    case DType::kBool: return static_cast<double>((k / 2) % 2);
  }
  return 0;
}

Tensor edge_tensor(const Shape& shape, DType dtype, int salt) {
  BufferPtr buf = Buffer::allocate(static_cast<size_t>(numel(shape)) * dtype_size(dtype));
  for (int64_t i = 0; i < numel(shape); ++i) store_element(buf->data(), dtype, i, edge_value(dtype, i, salt));
  return Tensor::from_buffer(buf, {shape, dtype});
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const BufferPtr buf = t.buffer();
  const auto* p = static_cast<const uint8_t*>(buf->data());
  return {p, p + static_cast<size_t>(t.numel()) * dtype_size(t.dtype())};
}

// One result of the walk: the op applied to operands of these shapes.
struct Case {
  std::vector<Shape> operands;
};

// The operand shapes per case for an op of `arity` operands: flat sizes around the vector
// width, then each broadcast form in each operand position.
std::vector<Case> cases_for(int arity) {
  std::vector<Case> out;
  for (int64_t n : {0, 1, 7, 15, 16, 17, 100}) out.push_back({std::vector<Shape>(arity, Shape{n})});
  if (arity == 1) return out;
  const std::vector<std::pair<Shape, Shape>> forms = {
      {{5, 37}, {}},          // a scalar operand
      {{5, 37}, {37}},        // a bias row (kTile), 37 = two vectors and 5 over
      {{5, 37}, {5, 1}},      // a per-row value (kSpread)
      {{2, 3, 20}, {1, 3, 1}},  // a middle run (kRun)
      {{6, 20}, {20}},        // rows of one vector and 4 over
  };
  for (const auto& [full, part] : forms) {
    for (int at = 0; at < arity; ++at) {
      std::vector<Shape> shapes(arity, full);
      shapes[at] = part;
      out.push_back({shapes});
    }
  }
  std::vector<Shape> general(arity, Shape{2, 3, 20});
  general[0] = {2, 1, 20};  // neither a row, a per-row value nor a middle run
  out.push_back({general});
  // Broadcasts of two periods: a per-row value (17) with a general broadcast, or a bias row (17)
  // with a per-row value of period 51; the second is gathered.
  if (arity == 2) out.push_back({{{4, 1, 17}, {4, 3, 1}}});
  if (arity == 3) out.push_back({{{17}, {4, 1, 1}, {4, 3, 17}}});
  return out;
}

struct Results {
  std::vector<std::vector<uint8_t>> bytes;
  CompileStats stats;
};

// Runs every case of `op` on `dtype` operands (where: a bool condition first) in one step of
// a fresh runtime, with or without generated code.
Results run_cases(Op op, DType dtype, DType cast_to, const std::vector<Case>& cases, bool codegen) {
  ScopedRuntime rt(codegen_options(codegen));
  std::vector<Tensor> outs;
  for (const Case& c : cases) {
    std::vector<Tensor> operands;
    for (size_t k = 0; k < c.operands.size(); ++k) {
      const DType d = op == Op::kWhere && k == 0 ? DType::kBool : dtype;
      operands.push_back(edge_tensor(c.operands[k], d, static_cast<int>(k)));
    }
    Attrs attrs;
    attrs.dtype = cast_to;
    outs.push_back(record(op, operands, attrs));
  }
  mark_step();
  Results r;
  r.stats = runtime().last_stats();
  for (const Tensor& t : outs) r.bytes.push_back(bytes_of(t));
  return r;
}

// Whether the shape rule of `op` accepts `dtype` operands (casts: to `cast_to`).
bool accepts(Op op, DType dtype, DType cast_to) {
  const int arity = op_info(op).arity;
  std::vector<ValueType> types(arity, ValueType{{3}, dtype});
  if (op == Op::kWhere) types[0].dtype = DType::kBool;
  Attrs attrs;
  attrs.dtype = cast_to;
  try {
    infer_type(op, types, attrs);
    return true;
  } catch (const InvalidArgument&) {
    return false;
  }
}

void expect_same_bits(Op op, DType dtype, DType cast_to) {
  const std::string what = fmt::format("{} on {}{}", op_name(op), dtype_name(dtype),
                                       op == Op::kCast ? fmt::format(" to {}", dtype_name(cast_to)) : "");
  const std::vector<Case> native = cases_for(op_info(op).arity);
  const Results generated = run_cases(op, dtype, cast_to, native, true);
  const Results interpreted = run_cases(op, dtype, cast_to, native, false);
  EXPECT_EQ(generated.stats.interpreted_loops, 0) << what;
  EXPECT_GT(generated.stats.native_loops, 0) << what;
  EXPECT_EQ(interpreted.stats.native_loops, 0) << what;
  for (size_t i = 0; i < native.size(); ++i) {
    const std::vector<uint8_t>& a = generated.bytes[i];
    const std::vector<uint8_t>& b = interpreted.bytes[i];
    ASSERT_EQ(a.size(), b.size()) << what;
    const auto diff = std::mismatch(a.begin(), a.end(), b.begin());
    EXPECT_TRUE(diff.first == a.end())
        << what << ", operands " << fmt::format("{}", fmt::join(native[i].operands, " ")) << ": element "
        << (diff.first - a.begin()) / static_cast<ptrdiff_t>(dtype_size(op == Op::kCast ? cast_to : dtype))
        << " differs";
  }
}

TEST(CodegenWalk, EveryElementwiseOpOnEveryDtypeMatchesTheInterpreterBitForBit) {
  int walked = 0;
  for (int o = 0; o < kNumOps; ++o) {
    const Op op = static_cast<Op>(o);
    if (!is_elementwise(op)) continue;
    for (DType dtype : kDTypes) {
      if (op == Op::kCast) {
        for (DType to : kDTypes) {  // a cast to its own dtype is folded away: no loop
          if (to != dtype && accepts(op, dtype, to)) expect_same_bits(op, dtype, to), ++walked;
        }
      } else if (accepts(op, dtype, DType::kF32)) {
        expect_same_bits(op, dtype, DType::kF32);
        ++walked;
      }
    }
  }
  EXPECT_GT(walked, 100) << "the walk reached too few (op, dtype) pairs: is ops.def read?";
}


// INT_MIN / -1 traps in hardware (SIGFPE); both paths define it as the wrapped -x, as x / 0
// is defined as 0.
TEST(CodegenWalk, IntegerDivisionByMinusOneWrapsOnBothPathsInsteadOfTrapping) {
  for (bool codegen : {true, false}) {
    ScopedRuntime rt(codegen_options(codegen));
    const std::vector<int32_t> xs = {INT32_MIN, 7, INT32_MIN, -9, 5};
    const std::vector<int32_t> ys = {-1, -1, 0, 2, -1};
    Tensor q = div(Tensor::from_vector<int32_t>(xs, {5}), Tensor::from_vector<int32_t>(ys, {5}));
    const std::vector<int64_t> xl = {INT64_MIN, 3};
    const std::vector<int64_t> yl = {-1, -1};
    Tensor ql = div(Tensor::from_vector<int64_t>(xl, {2}), Tensor::from_vector<int64_t>(yl, {2}));
    mark_step();
    EXPECT_EQ(q.to_vector<int32_t>(), (std::vector<int32_t>{INT32_MIN, -7, 0, -4, -5})) << "codegen " << codegen;
    EXPECT_EQ(ql.to_vector<int64_t>(), (std::vector<int64_t>{INT64_MIN, -3})) << "codegen " << codegen;
  }
}


// ---- random numbers in loops ----

constexpr Op kRandomOps[] = {Op::kRandUniform, Op::kRandNormal, Op::kBernoulli};

Tensor draw(Op op, const Shape& shape, DType dtype, int64_t seed) {
  Tensor s = Tensor::from_vector<int64_t>({seed}, {});
  if (op == Op::kRandUniform) return rand_uniform(shape, dtype, s);
  if (op == Op::kRandNormal) return rand_normal(shape, dtype, s);
  return bernoulli(shape, 0.3, dtype, s);
}

// The op kernel's values (random_kernel, the reference) for the same draw.
std::vector<uint8_t> reference_bytes(Op op, const Shape& shape, DType dtype, int64_t seed, float p = 0.3f) {
  const ValueType out_type{shape, dtype}, seed_type{{}, DType::kI64}, p_type{{}, DType::kF32};
  std::vector<uint8_t> out(static_cast<size_t>(numel(shape)) * dtype_size(dtype) + 1);
  const detail::Arg ins[] = {{&seed, &seed_type}, {&p, &p_type}};
  detail::random_kernel(op, Attrs{}, std::span<const detail::Arg>(ins, op == Op::kBernoulli ? 2 : 1),
                        detail::Arg{out.data(), &out_type});
  out.pop_back();
  return out;
}

// A draw stored on its own (a loop of one random step) and a draw that a loop computes where
// it reads it (r * 1, which keeps every bit, -0 included) give the op kernel's values bit for
// bit, generated and interpreted, at sizes around the vector width and in rows.
TEST(CodegenRandom, DrawsInLoopsMatchTheOpKernelBitForBit) {
  const std::vector<Shape> shapes = {{0}, {1}, {7}, {15}, {16}, {17}, {100}, {5, 37}, {3, 2, 21}};
  for (Op op : kRandomOps) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF64}) {
      for (bool codegen : {true, false}) {
        ScopedRuntime rt(codegen_options(codegen));
        std::vector<Tensor> stored, inlined, widened;
        const Tensor one = Tensor::from_vector<float>({1.0f}, {}, dtype);  // data: x * 1 is not folded
        for (size_t i = 0; i < shapes.size(); ++i) {
          stored.push_back(draw(op, shapes[i], dtype, 11 + static_cast<int64_t>(i)));
          inlined.push_back(draw(op, shapes[i], dtype, 11 + static_cast<int64_t>(i)) * one);
          // Read in a loop at another dtype: a bf16 draw is read as its bf16 value.
          if (dtype != DType::kF64) widened.push_back(cast(draw(op, shapes[i], dtype, 11 + static_cast<int64_t>(i)), DType::kF64));
        }
        mark_step();
        const std::string what = fmt::format("{} {} codegen {}", op_name(op), dtype_name(dtype), codegen);
        EXPECT_EQ(rt->last_stats().native_loops > 0, codegen) << what;
        EXPECT_EQ(rt->last_stats().interpreted_loops, 0) << what;
        for (size_t i = 0; i < shapes.size(); ++i) {
          const std::vector<uint8_t> want = reference_bytes(op, shapes[i], dtype, 11 + static_cast<int64_t>(i));
          EXPECT_EQ(bytes_of(stored[i]), want) << what << " stored, shape " << fmt::format("{}", shapes[i]);
          EXPECT_EQ(bytes_of(inlined[i]), want) << what << " computed in a loop, shape " << fmt::format("{}", shapes[i]);
          if (dtype == DType::kF64) continue;
          const std::vector<double> got = widened[i].to_vector<double>();
          for (int64_t j = 0; j < numel(shapes[i]); ++j) {
            ASSERT_EQ(got[j], load_element(want.data(), dtype, j)) << what << " read as f64, shape "
                                                                    << fmt::format("{}", shapes[i]) << ", element " << j;
          }
        }
      }
    }
  }
}

// The kernels of the program computing `roots`, as text.
std::string program_text(const std::vector<Tensor>& roots) {
  std::vector<NodePtr> nodes;
  for (const Tensor& t : roots) nodes.push_back(t.ir());
  return compile_graph(cut_graph(nodes, /*allow_donation=*/false))->text();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Dropout's mask is never stored: the forward's loop and the backward's loop each compute it
// (one bernoulli step in each), and the gradient still equals grad * mask / (1 - p) with the
// mask the op kernel draws.
TEST(CodegenRandom, ADropoutMaskIsComputedWhereItIsReadAndNeverStored) {
  ScopedRuntime rt;
  const Shape shape{8, 40};
  std::vector<float> xv(320), wv(320);
  for (int i = 0; i < 320; ++i) xv[i] = static_cast<float>(i % 17) / 8.0f - 1.0f, wv[i] = static_cast<float>(i % 5) - 2.0f;
  Tensor x = Tensor::from_vector<float>(xv, shape);
  x.set_requires_grad(true);
  Tensor w = Tensor::from_vector<float>(wv, shape);
  Tensor seed = Tensor::from_vector<int64_t>({5}, {});
  Tensor keep = bernoulli(shape, 0.75, DType::kF32, seed);
  Tensor y = x * keep * (1 / 0.75);
  Tensor loss = sum(y * w);
  backward(loss);
  const std::string text = program_text({loss, x.grad()});
  EXPECT_EQ(count(text, "=bernoulli"), 2u) << text;
  EXPECT_EQ(count(text, "bernoulli("), 0u) << "no kernel of its own: " << text;
  mark_step();
  const std::vector<uint8_t> mask_bytes = reference_bytes(Op::kBernoulli, shape, DType::kF32, 5, 0.75f);
  const auto* mask = reinterpret_cast<const float*>(mask_bytes.data());
  const std::vector<float> grad = x.grad().to_vector<float>();
  int kept = 0;
  for (int i = 0; i < 320; ++i) {
    EXPECT_EQ(grad[i], wv[i] * mask[i] * static_cast<float>(1 / 0.75)) << i;
    kept += mask[i] == 1.0f;
  }
  EXPECT_GT(kept, 200);
  EXPECT_LT(kept, 280);
}

// A draw read where a loop cannot compute it (by a matmul, or broadcast to another shape) is
// stored by a loop of its own, and its readers see the op kernel's values.
TEST(CodegenRandom, ADrawReadOutsideALoopOrAtAnotherShapeIsStoredOnce) {
  ScopedRuntime rt;
  Tensor seed = Tensor::from_vector<int64_t>({9}, {});
  Tensor r = rand_uniform({4, 4}, DType::kF32, seed);
  Tensor row = rand_uniform({4}, DType::kF32, Tensor::from_vector<int64_t>({10}, {}));
  Tensor product = matmul(r, r);
  Tensor spread = Tensor::from_vector<float>(std::vector<float>(12, 0.5f), {3, 4}) + row;
  const std::string text = program_text({product, spread});
  EXPECT_EQ(count(text, "=rand_uniform"), 2u) << text;
  mark_step();
  const std::vector<uint8_t> rb = reference_bytes(Op::kRandUniform, {4, 4}, DType::kF32, 9);
  const std::vector<uint8_t> rowb = reference_bytes(Op::kRandUniform, {4}, DType::kF32, 10);
  const auto* rv = reinterpret_cast<const float*>(rb.data());
  const auto* rowv = reinterpret_cast<const float*>(rowb.data());
  const std::vector<float> p = product.to_vector<float>(), sp = spread.to_vector<float>();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      float want = 0;
      for (int k = 0; k < 4; ++k) want += rv[i * 4 + k] * rv[k * 4 + j];
      EXPECT_NEAR(p[i * 4 + j], want, 1e-6) << i << "," << j;
    }
  for (int i = 0; i < 12; ++i) EXPECT_EQ(sp[i], 0.5f + rowv[i % 4]) << i;
}


// A loop that makes a draw's seed may be merged into a later loop only if no loop between
// them computes the draw from that seed (a draw has no kernel of its own, so its readers
// are the seed's readers).
TEST(CodegenRandom, TheLoopThatMakesASeedStaysBeforeTheLoopsThatDrawFromIt) {
  for (bool codegen : {true, false}) {
    ScopedRuntime rt(codegen_options(codegen));
    const Tensor seed = Tensor::from_vector<int64_t>({5}, {}) + Tensor::from_vector<int64_t>({1}, {});
    const Tensor c = cast(seed, DType::kF32);
    const Tensor x = Tensor::from_vector<float>(std::vector<float>(40, 2.0f), {40});
    const Tensor y = x * rand_uniform({40}, DType::kF32, seed);
    const Tensor v = c + sum(y);
    mark_step();
    const std::vector<uint8_t> want_bytes = reference_bytes(Op::kRandUniform, {40}, DType::kF32, 6);
    const auto* want = reinterpret_cast<const float*>(want_bytes.data());
    const std::vector<float> got = y.to_vector<float>();
    for (int i = 0; i < 40; ++i) ASSERT_EQ(got[i], 2.0f * want[i]) << "codegen " << codegen << ", element " << i;
    EXPECT_GT(v.item(), 6.0);
  }
}


// A reduction case: x * y + x over `shape` (x, y: `values` 0 the edge values, 1 finite values
// with -0), reduced over `axes`; `bias` adds a broadcast operand of that shape to the product.
struct ReduceCase {
  Shape shape;
  std::vector<int64_t> axes;
  Shape bias;
  bool sum_stays_a_kernel = false;  // axes not one run, rows of fewer than 16 reduced values
};

std::vector<ReduceCase> reduce_cases() {
  std::vector<ReduceCase> out;
  for (int64_t n : {1, 7, 15, 16, 17, 100}) out.push_back({{n}, {0}, {}});
  for (std::vector<int64_t> axes : {std::vector<int64_t>{0}, {1}, {0, 1}}) out.push_back({{5, 37}, axes, {}});
  for (std::vector<int64_t> axes : {std::vector<int64_t>{0}, {1}, {2}, {0, 1}, {1, 2}}) out.push_back({{3, 2, 21}, axes, {}});
  out.push_back({{6, 20}, {1}, {20}});      // a bias row, the row reduced (period == reduced)
  out.push_back({{6, 20}, {0}, {20}});      // a bias row, the columns reduced (period == inner)
  out.push_back({{6, 20}, {1}, {6, 1}});    // a per-row value, the row reduced
  out.push_back({{6, 20}, {0, 1}, {20}});  // a bias row whose period is not the row: gathered
  out.push_back({{6, 34}, {0}, {1, 34}});
  // Axes that are not one run: rows of reduced elements (a conv bias gradient's [0, 2, 3],
  // runs of 49 that start at another lane of the sum in every row), rows of kept ones, a kept
  // axis of extent 1, 40 kept values (a vector and a tail when they are stored), broadcasts.
  out.push_back({{3, 2, 21}, {0, 2}, {}});
  out.push_back({{8, 5, 7, 7}, {0, 2, 3}, {}});
  out.push_back({{4, 3, 5, 6}, {0, 2}, {}});
  out.push_back({{4, 3, 5, 6}, {1, 3}, {}, true});
  out.push_back({{2, 3, 8, 17}, {0, 2}, {}});
  out.push_back({{5, 1, 33}, {0, 2}, {}});
  out.push_back({{6, 40, 3}, {0, 2}, {}, true});
  out.push_back({{6, 40, 17}, {0, 2}, {}});
  out.push_back({{6, 4, 20}, {0, 2}, {4, 1}});    // a per-channel bias
  out.push_back({{6, 4, 20}, {0, 2}, {20}});      // a bias row
  out.push_back({{64, 8, 1, 1}, {0, 2, 3}, {}});  // axes of extent 1 go with either kind: rows of 8 kept
  out.push_back({{16, 5, 2}, {0, 2}, {}, true});       // rows of 2 reduced values
  out.push_back({{9, 3, 2, 2}, {0, 2, 3}, {}, true});  // rows of 4
  out.push_back({{20, 1, 6, 1}, {0, 2}, {}});    // one kept value: a single reduced run
  return out;
}

Tensor reduce_values(const Shape& shape, DType dtype, int salt, int values) {
  if (values == 0) return edge_tensor(shape, dtype, salt);
  BufferPtr buf = Buffer::allocate(static_cast<size_t>(numel(shape)) * dtype_size(dtype));
  for (int64_t i = 0; i < numel(shape); ++i) {
    const double v = i % 11 == 3 ? -0.0 : static_cast<double>((i * 37 + salt * 13) % 101 - 50) * 0.0137;
    store_element(buf->data(), dtype, i, v);
  }
  return Tensor::from_buffer(buf, {shape, dtype});
}

// The first element whose bits differ, NaNs of any sign and payload counting as equal (which
// NaN an add of two NaNs returns depends on the order of its operands, which IEEE 754 leaves
// open and LLVM may swap); -1 if none.
int64_t first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, DType dtype) {
  const size_t size = dtype_size(dtype);
  for (size_t i = 0; i * size < a.size(); ++i) {
    if (std::memcmp(a.data() + i * size, b.data() + i * size, size) == 0) continue;
    const int64_t k = static_cast<int64_t>(i);
    if (!(std::isnan(load_element(a.data(), dtype, k)) && std::isnan(load_element(b.data(), dtype, k)))) return k;
  }
  return -1;
}

Tensor reduce_by(Op op, const Tensor& x, const std::vector<int64_t>& axes) {
  switch (op) {
    case Op::kSum: return sum(x, axes);
    case Op::kMean: return mean(x, axes);
    case Op::kMax: return max(x, axes);
    case Op::kArgmax: return argmax(x, axes.at(0));
    default: return min(x, axes);
  }
}

// The reduction kernel's (or argmax kernel's) result for `op` over `axes` of `operand`.
std::vector<uint8_t> kernel_result(Op op, const Tensor& operand, const std::vector<int64_t>& axes, const Tensor& result) {
  const ValueType in_type{operand.shape(), operand.dtype()};
  const ValueType out_type{result.shape(), result.dtype()};
  std::vector<uint8_t> in = bytes_of(operand);
  std::vector<uint8_t> want(static_cast<size_t>(result.numel()) * dtype_size(result.dtype()));
  Attrs attrs;
  attrs.ints = axes;
  const detail::Arg x{in.data(), &in_type}, out{want.data(), &out_type};
  if (op == Op::kArgmax) detail::argmax_kernel(attrs, x, out);
  else detail::reduce_kernel(op, attrs, x, out);
  return want;
}

void expect_same_result(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, DType dtype,
                        const std::string& what) {
  const int64_t at = first_difference(got, want, dtype);
  EXPECT_EQ(at, -1) << what << ": " << load_element(got.data(), dtype, at) << " against "
                    << load_element(want.data(), dtype, at);
}

// A float sum, mean, max or min joins the loop computing its operand, and gives what the
// reduction kernel gives on the operand's stored values, bit for bit: generated and
// interpreted, with the operand stored (also a root) and not stored, over a whole run, over
// leading or middle axes, with broadcast operands in the loop, at sizes around the vector width.
TEST(CodegenReduce, AReductionInItsOperandsLoopEqualsTheReductionKernelBitForBit) {
  for (Op op : {Op::kSum, Op::kMean, Op::kMax, Op::kMin, Op::kArgmax}) {
    std::vector<ReduceCase> cases = reduce_cases();
    if (op == Op::kArgmax) std::erase_if(cases, [](const ReduceCase& c) { return c.axes.size() != 1; });
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF64}) {
      for (int values : {0, 1}) {
        for (bool codegen : {true, false}) {
          for (bool operand_is_root : {true, false}) {
            ScopedRuntime rt(codegen_options(codegen));
            auto operand = [&](const ReduceCase& c) {
              const Tensor x = reduce_values(c.shape, dtype, 0, values), y = reduce_values(c.shape, dtype, 1, values);
              const Tensor p = x * y + x;
              return c.bias.empty() ? p : p + reduce_values(c.bias, dtype, 2, values);
            };
            std::vector<Tensor> operands, reduced;
            for (const ReduceCase& c : cases) {
              const Tensor p = operand(c);
              reduced.push_back(reduce_by(op, p, c.axes));
              if (operand_is_root) operands.push_back(p);
            }
            mark_step();  // the operands are roots only when held
            const CompileStats stats = rt->last_stats();
            const std::string what = fmt::format("{} {} values {} codegen {} operand stored {}", op_name(op),
                                                 dtype_name(dtype), values, codegen, operand_is_root);
            const bool sum = op == Op::kSum || op == Op::kMean;
            const auto kernels = std::count_if(cases.begin(), cases.end(),
                                               [&](const ReduceCase& c) { return sum && c.sum_stays_a_kernel; });
            EXPECT_EQ(stats.fused_reductions, static_cast<int64_t>(cases.size()) - kernels) << what;
            EXPECT_EQ(stats.interpreted_loops, 0) << what;
            EXPECT_EQ(stats.native_loops > 0, codegen) << what;
            if (!operand_is_root) {
              for (const ReduceCase& c : cases) operands.push_back(operand(c));
              mark_step();
            }
            for (size_t i = 0; i < cases.size(); ++i) {
              expect_same_result(bytes_of(reduced[i]), kernel_result(op, operands[i], cases[i].axes, reduced[i]),
                                 reduced[i].dtype(),
                                 fmt::format("{}, shape {} axes {}", what, cases[i].shape, cases[i].axes));
            }
          }
        }
      }
    }
  }
}

// argmax gives the first NaN's index where there is a NaN (as torch and numpy do), else the
// first largest value's: the kernel, and fused in a loop over a whole row (axis 1) and over
// columns (axis 0), generated and interpreted.
TEST(CodegenReduce, ArgmaxGivesTheFirstNaNsIndex) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Rows: NaN after the largest; NaN first; two NaNs (the first wins); no NaN, ties (the first).
  const std::vector<float> values = {1, 9, 3, nan, 9, 2, nan, 7, 8, 1, 0, 4,
                                     5, 2, nan, 6, nan, 1, 3, 3, 7, 7, 2, 7};
  const std::vector<int64_t> want_rows = {3, 0, 2, 2};  // argmax over axis 1 of [4, 6]
  const std::vector<int64_t> want_cols = {1, 0, 2, 0, 2, 3};  // over axis 0
  for (bool codegen : {true, false}) {
    ScopedRuntime rt(codegen_options(codegen));
    const Tensor x = Tensor::from_vector<float>(values, {4, 6});
    const Tensor one = Tensor::from_vector<float>(std::vector<float>(24, 1.0f), {4, 6});
    const Tensor kernel_rows = argmax(x, 1), kernel_cols = argmax(x, 0);
    mark_step();
    const Tensor fused_rows = argmax(x * one, 1);
    mark_step();
    EXPECT_EQ(rt->last_stats().fused_reductions, 1);
    const Tensor fused_cols = argmax(x * one, 0);
    mark_step();
    EXPECT_EQ(rt->last_stats().fused_reductions, 1);
    EXPECT_EQ(kernel_rows.to_vector<int64_t>(), want_rows) << "codegen " << codegen;
    EXPECT_EQ(fused_rows.to_vector<int64_t>(), want_rows) << "codegen " << codegen;
    EXPECT_EQ(kernel_cols.to_vector<int64_t>(), want_cols) << "codegen " << codegen;
    EXPECT_EQ(fused_cols.to_vector<int64_t>(), want_cols) << "codegen " << codegen;
  }
}

// Over axes that are not one run a sum keeps sixteen double lanes per kept value, so it joins
// the loop only when it sums at least sixteen values into each, and not in rows of fewer than
// sixteen reduced values, where the kernel's pass is faster; max and min join either way.
TEST(CodegenReduce, ASumOfFewValuesOrShortRowsOverAxesThatAreNotOneRunStaysAKernel) {
  ScopedRuntime rt(codegen_options(true));
  const Tensor x = reduce_values({5, 40, 3}, DType::kF32, 0, 1), y = reduce_values({5, 40, 3}, DType::kF32, 1, 1);
  const Tensor few = sum(x * y + x, {0, 2});  // 15 values per kept index
  mark_step();
  EXPECT_EQ(rt->last_stats().fused_reductions, 0);
  const Tensor highest = max(x * y + x, {0, 2});
  mark_step();
  EXPECT_EQ(rt->last_stats().fused_reductions, 1);
  const Tensor enough = sum(reduce_values({6, 40, 17}, DType::kF32, 0, 1) * 2.0, {0, 2});  // 102, rows of 17
  mark_step();
  EXPECT_EQ(rt->last_stats().fused_reductions, 1);
  const Tensor short_rows = sum(reduce_values({9, 40, 3}, DType::kF32, 0, 1) * 2.0, {0, 2});  // 27, rows of 3
  mark_step();
  EXPECT_EQ(rt->last_stats().fused_reductions, 0);
  const Tensor short_max = max(reduce_values({9, 40, 3}, DType::kF32, 0, 1) * 2.0, {0, 2});
  mark_step();
  EXPECT_EQ(rt->last_stats().fused_reductions, 1);
}

// A reduction of a GEMM's epilogue value (relu(a b + x)) joins the epilogue, as it joins a
// loop, with the same results.
TEST(CodegenReduce, AReductionOfAGemmEpilogueJoinsTheEpilogue) {
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{5, 37}, {0}}, {{5, 37}, {1}}, {{16, 20}, {0}}, {{17, 33}, {1}}, {{17, 33}, {0, 1}}};
  for (Op op : {Op::kSum, Op::kMean, Op::kMax, Op::kMin, Op::kArgmax}) {
    for (DType dtype : {DType::kF32, DType::kF64}) {
      for (bool codegen : {true, false}) {
       for (bool operand_is_root : {true, false}) {
        ScopedRuntime rt(codegen_options(codegen));
        auto operand = [&](const Shape& shape) {
          const Tensor a = reduce_values({shape[0], 7}, dtype, 0, 1), b = reduce_values({7, shape[1]}, dtype, 1, 1);
          return relu(matmul(a, b) + reduce_values(shape, dtype, 2, 1));
        };
        std::vector<Tensor> operands, reduced;
        std::vector<std::vector<int64_t>> axes;
        std::vector<Shape> shapes;
        for (const auto& [shape, ax] : cases) {
          if (op == Op::kArgmax && ax.size() != 1) continue;
          const Tensor p = operand(shape);
          if (operand_is_root) operands.push_back(p);
          reduced.push_back(reduce_by(op, p, ax));
          axes.push_back(ax);
          shapes.push_back(shape);
        }
        mark_step();  // the operands are roots only when held
        const std::string what = fmt::format("{} {} codegen {} operand stored {}", op_name(op), dtype_name(dtype),
                                             codegen, operand_is_root);
        EXPECT_EQ(rt->last_stats().fused_reductions, static_cast<int64_t>(reduced.size())) << what;
        EXPECT_EQ(rt->last_stats().matmul_epilogues, static_cast<int64_t>(reduced.size())) << what;
        if (!operand_is_root) {
          for (const Shape& shape : shapes) operands.push_back(operand(shape));
          mark_step();
        }
        for (size_t i = 0; i < reduced.size(); ++i) {
          expect_same_result(bytes_of(reduced[i]), kernel_result(op, operands[i], axes[i], reduced[i]), reduced[i].dtype(),
                             fmt::format("{}, shape {} axes {}", what, operands[i].shape(), axes[i]));
        }
       }
      }
    }
  }
}

// Loops equal but for the buffers they touch (each tensor's sum of squares, as a clipping
// norm builds them) share one generated function, and each still reads and writes its own
// buffers: every result equals the interpreter's bit for bit.
TEST(CodegenShare, LoopsThatDifferOnlyInTheirBuffersShareOneFunction) {
  const std::vector<Shape> shapes = {{37}, {37}, {37}, {5, 16}, {5, 16}, {5, 16}};
  std::vector<std::vector<uint8_t>> results[2];
  for (bool codegen : {true, false}) {
    ScopedRuntime rt(codegen_options(codegen));
    std::vector<Tensor> sums;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Tensor p = reduce_values(shapes[i], DType::kF32, static_cast<int>(i), 1);
      const Tensor q = reduce_values(shapes[i], DType::kF32, static_cast<int>(i) + 7, 1);
      sums.push_back(sum(p * q + p));
    }
    mark_step();
    const CompileStats& stats = rt->last_stats();
    EXPECT_EQ(stats.fused_reductions, 6);
    EXPECT_EQ(stats.native_loops, codegen ? 6 : 0);
    EXPECT_EQ(stats.native_functions, codegen ? 2 : 0);
    for (const Tensor& t : sums) results[codegen].push_back(bytes_of(t));
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(results[1][i], results[0][i]) << "sum " << i;
    if (i > 0) {
      EXPECT_NE(results[1][i], results[1][i - 1]) << "sums " << i - 1 << " and " << i << " are alike";
    }
  }
}

}  // namespace
}  // namespace xs
