// oneDNN matmul and convolution primitives as prepared kernels (onednn.h). A matmul works on
// the runtime's row-major buffers as they are (a transposed operand is described by its
// strides): a run wraps them and executes. A convolution works in the channel-blocked layouts
// oneDNN chooses for its direct kernels; reorder primitives made with it move the operands
// into and out of per-thread scratch. oneDNN's CPU runtime is OpenMP; a replica owns one core,
// so primitives are made and run with one OpenMP thread, which also fixes their reduction
// order: the same inputs give the same bits on every run and in every process.
#include "xla_spawn/runtime/kernels/onednn.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"

namespace xs::detail {
namespace {

using Dims = dnnl::memory::dims;
using DataType = dnnl::memory::data_type;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Streams are not thread-safe; one per thread that runs kernels.
dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

DataType onednn_type(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return DataType::bf16;
    case DType::kF32:
      return DataType::f32;
    case DType::kF64:
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
      return DataType::undef;
  }
  return DataType::undef;
}

// The implementation oneDNN chose ("brg:avx512_core_bf16", "gemm:jit", "ref:any", ...).
std::string impl_of(const dnnl::primitive_desc_base& pd) {
  const char* name = nullptr;
  dnnl_primitive_desc_query(pd.get(), dnnl_query_impl_info_str, 0, &name);
  return name != nullptr ? name : "?";
}

// Executes `prim` on this thread with one OpenMP thread and waits for it.
void execute(const dnnl::primitive& prim, const std::unordered_map<int, dnnl::memory>& args) {
  omp_set_num_threads(1);
  dnnl::stream& s = thread_stream();
  prim.execute(s, args);
  s.wait();
}

dnnl::memory wrap(const dnnl::memory::desc& md, const void* p) {
  return dnnl::memory(md, cpu_engine(), const_cast<void*>(p));
}

class OnednnMatmul final : public PreparedKernel {
 public:
  OnednnMatmul(dnnl::matmul::primitive_desc pd, dnnl::memory::desc a, dnnl::memory::desc b,
               dnnl::memory::desc c)
      : prim_(pd), a_(a), b_(b), c_(c), impl_(impl_of(pd)) {}

  void run(std::span<const Arg> ins, const Arg& out) const override {
    execute(prim_, {{DNNL_ARG_SRC, wrap(a_, ins[0].data)},
                    {DNNL_ARG_WEIGHTS, wrap(b_, ins[1].data)},
                    {DNNL_ARG_DST, wrap(c_, out.data)}});
  }
  std::string text() const override { return "onednn " + impl_; }

 private:
  dnnl::matmul prim_;
  dnnl::memory::desc a_, b_, c_;
  std::string impl_;
};

// Per-thread buffers for operands in oneDNN's blocked layouts, one per operand position,
// kept between calls (a fresh allocation per call would fault its pages in every step).
void* layout_scratch(int role, size_t bytes) {
  struct Buf {
    void* base = nullptr;
    size_t cap = 0;
    ~Buf() { std::free(base); }
  };
  thread_local Buf bufs[3];
  Buf& b = bufs[role];
  if (b.cap < bytes) {
    std::free(b.base);
    b.cap = (bytes + 4095) / 4096 * 4096;  // page-aligned: oneDNN's kernels load whole lines
    b.base = std::aligned_alloc(4096, b.cap);
    XS_CHECK(b.base != nullptr, "oneDNN layout scratch of {} bytes: out of memory", b.cap);
  }
  return b.base;
}

// A convolution primitive (forward, backward data or backward weights) over two operands.
// Operands in the runtime's plain layout, and a reorder to or from the layout the primitive
// chose when that differs (the blocked layouts of its direct JIT kernels).
class OnednnConv final : public PreparedKernel {
 public:
  struct Operand {
    int arg;  // DNNL_ARG_*
    dnnl::memory::desc plain, inner;
    std::optional<dnnl::reorder> reorder;  // plain -> inner (inputs), inner -> plain (output)
  };
  OnednnConv(dnnl::primitive prim, std::string impl, std::vector<Operand> operands)
      : prim_(std::move(prim)), impl_(std::move(impl)), operands_(std::move(operands)) {}

  void run(std::span<const Arg> ins, const Arg& out) const override {
    std::unordered_map<int, dnnl::memory> args;
    std::optional<dnnl::memory> out_plain;
    for (int i = 0; i < 3; ++i) {
      const Operand& o = operands_[i];
      const dnnl::memory plain = wrap(o.plain, i < 2 ? ins[i].data : out.data);
      if (!o.reorder) {
        args.emplace(o.arg, plain);
        continue;
      }
      const dnnl::memory inner = wrap(o.inner, layout_scratch(i, o.inner.get_size()));
      if (i < 2)
        execute(*o.reorder, {{DNNL_ARG_FROM, plain}, {DNNL_ARG_TO, inner}});
      else
        out_plain = plain;
      args.emplace(o.arg, inner);
    }
    execute(prim_, args);
    if (out_plain)
      execute(*operands_[2].reorder,
              {{DNNL_ARG_FROM, args.at(operands_[2].arg)}, {DNNL_ARG_TO, *out_plain}});
  }
  std::string text() const override { return "onednn " + impl_; }

 private:
  dnnl::primitive prim_;
  std::string impl_;
  std::vector<Operand> operands_;  // the two inputs, then the output
};

// The operand `arg` of `pd`, whose runtime layout is `plain`: with a reorder when the
// primitive wants another layout.
OnednnConv::Operand conv_operand(const dnnl::primitive_desc_base& pd, int arg,
                                 const dnnl::memory::desc& plain, bool is_output) {
  OnednnConv::Operand o{arg, plain, pd.query_md(dnnl::query::exec_arg_md, arg), std::nullopt};
  if (o.inner != plain) {
    o.reorder = is_output ? dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), o.inner,
                                                                        cpu_engine(), plain))
                          : dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), plain,
                                                                        cpu_engine(), o.inner));
  }
  return o;
}

// The three tensors of a convolution y = conv(x, w), whichever of them the op computes.
struct ConvShapes {
  Shape x, w, y;
};

ConvShapes conv_shapes(Op op, std::span<const ValueType> ins, const ValueType& out) {
  switch (op) {
    case Op::kConv2d:
      return {ins[0].shape, ins[1].shape, out.shape};
    case Op::kConv2dGradInput:
      return {out.shape, ins[1].shape, ins[0].shape};
    case Op::kConv2dGradWeight:
      return {ins[0].shape, out.shape, ins[1].shape};
    default:
      XS_CHECK(false, "conv_shapes: {} is not a convolution", op_name(op));
  }
}

// A product with nothing to sum (k = 0) is zeros; one with no elements writes nothing.
class ZeroProduct final : public PreparedKernel {
 public:
  void run(std::span<const Arg>, const Arg& out) const override {
    std::memset(out.data, 0, numel(out.type->shape) * dtype_size(out.type->dtype));
  }
  std::string text() const override { return "zeros"; }
};

// The matmul operand stored as `stored` (rank >= 2), as oneDNN's logical [batch..., rows,
// cols] of rank `rank`: missing batch axes become leading 1s (oneDNN broadcasts them), and a
// transposed operand swaps the last two strides instead of being copied.
struct Layout {
  Dims dims, strides;
};
Layout matmul_layout(const Shape& stored, size_t rank, bool transposed) {
  Dims dims(rank - stored.size(), 1);
  dims.insert(dims.end(), stored.begin(), stored.end());
  Dims strides(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) strides[d - 1] = strides[d] * std::max<int64_t>(dims[d], 1);
  if (transposed) {
    std::swap(dims[rank - 1], dims[rank - 2]);
    std::swap(strides[rank - 1], strides[rank - 2]);
  }
  return {dims, strides};
}

dnnl::memory::desc matmul_operand(const Shape& stored, size_t rank, bool transposed, DataType dt) {
  const Layout l = matmul_layout(stored, rank, transposed);
  return dnnl::memory::desc(l.dims, dt, l.strides);
}

}  // namespace

bool cpu_has_bf16_dot() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  // oneDNN's ISA values are bit sets; every ISA with bf16 dot products (AMX too) has these bits.
  constexpr unsigned kBf16 = dnnl_cpu_isa_avx512_core_bf16;
  return (isa & kBf16) == kBf16;
}

bool use_onednn_bf16() {
  // Read at every compile (a getenv), not once: a test compares both engines in one process.
  const std::optional<std::string> v = env_string("XLA_SPAWN_BF16_ENGINE");
  if (!v || *v == "auto") return cpu_has_bf16_dot();
  if (*v == "onednn") return true;
  if (*v == "convert") return false;
  throw InvalidArgument(
      fmt::format("XLA_SPAWN_BF16_ENGINE={}: expected auto, onednn or convert", *v));
}

std::shared_ptr<const PreparedKernel> make_onednn_matmul(const Attrs& attrs, const ValueType& a,
                                                         const ValueType& b, const ValueType& out) {
  const DataType dt = onednn_type(out.dtype);
  if (dt == DataType::undef) return nullptr;
  const Shape& cs = out.shape;
  const size_t rank = cs.size();
  const int64_t k = a.shape[a.shape.size() - ((attrs.flag & 1) ? 2 : 1)];
  if (numel(cs) == 0) return std::make_shared<ZeroProduct>();  // writes 0 bytes
  if (k == 0) return std::make_shared<ZeroProduct>();
  const dnnl::memory::desc amd = matmul_operand(a.shape, rank, attrs.flag & 1, dt);
  const dnnl::memory::desc bmd = matmul_operand(b.shape, rank, attrs.flag & 2, dt);
  const dnnl::memory::desc cmd = matmul_operand(cs, rank, false, dt);
  try {
    omp_set_num_threads(1);  // primitives size their work split by the threads they may use
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(amd, bmd, cmd), cpu_engine());
    return std::make_shared<OnednnMatmul>(pd, amd, bmd, cmd);
  } catch (const dnnl::error& e) {
    spdlog::debug("onednn matmul {} x {} -> {}: {}; the plain kernel runs it", type_str(a),
                  type_str(b), type_str(out), e.what());
    return nullptr;
  }
}

namespace {

// A causal T x T product (kernels.h, kMatmulCausalOut...) as one primitive per row block over
// the whole batch: each block's operands and result are strided views into the full buffers
// (the parent's strides, smaller dims, an element offset), so oneDNN runs the batch of small
// products in one call where the BLAS took one call per matrix and block.
class OnednnCausalMatmul final : public PreparedKernel {
 public:
  struct Block {
    dnnl::matmul prim;
    dnnl::memory::desc a, b, c;
    int64_t a_offset, b_offset, c_offset;  // elements
    CausalBlock geometry;                   // columns from geometry.cols on are zeroed
  };
  OnednnCausalMatmul(std::vector<Block> blocks, int64_t batch, int64_t t, int64_t n, std::string impl)
      : blocks_(std::move(blocks)), batch_(batch), t_(t), n_(n), impl_(std::move(impl)) {}

  void run(std::span<const Arg> ins, const Arg& out) const override {
    const auto* a = static_cast<const float*>(ins[0].data);
    const auto* b = static_cast<const float*>(ins[1].data);
    auto* c = static_cast<float*>(out.data);
    for (const Block& k : blocks_) {
      execute(k.prim, {{DNNL_ARG_SRC, wrap(k.a, a + k.a_offset)},
                       {DNNL_ARG_WEIGHTS, wrap(k.b, b + k.b_offset)},
                       {DNNL_ARG_DST, wrap(k.c, c + k.c_offset)}});
      const CausalBlock& g = k.geometry;
      if (g.cols == n_) continue;
      for (int64_t s = 0; s < batch_; ++s)
        for (int64_t i = g.r0; i < g.r0 + g.rows; ++i)
          std::fill(c + (s * t_ + i) * n_ + g.cols, c + (s * t_ + i + 1) * n_, 0.0f);
    }
  }
  std::string text() const override { return "onednn causal " + impl_; }

 private:
  std::vector<Block> blocks_;
  int64_t batch_, t_, n_;
  std::string impl_;
};

// The operand with its last two dims cut to [rows, cols] from (row0, col0): its element
// offset and its descriptor (the full operand's strides).
std::pair<int64_t, dnnl::memory::desc> sub_block(const Layout& full, int64_t row0, int64_t rows, int64_t col0,
                                                 int64_t cols) {
  Dims dims = full.dims;
  const size_t r = dims.size();
  dims[r - 2] = rows;
  dims[r - 1] = cols;
  return {row0 * full.strides[r - 2] + col0 * full.strides[r - 1],
          dnnl::memory::desc(dims, DataType::f32, full.strides)};
}

}  // namespace

std::shared_ptr<const PreparedKernel> make_onednn_causal_matmul(const Attrs& attrs, const ValueType& a,
                                                                const ValueType& b, const ValueType& out) {
  const int64_t structure = attrs.flag & (kMatmulCausalOut | kMatmulLowerA | kMatmulUpperA);
  if (out.dtype != DType::kF32 || structure == 0 || out.shape.size() < 3 || numel(out.shape) == 0) return nullptr;
  const Shape& cs = out.shape;
  const size_t rank = cs.size();
  const int64_t t = cs[rank - 2], n = cs[rank - 1];
  const int64_t k = a.shape[a.shape.size() - ((attrs.flag & 1) ? 2 : 1)];
  const bool out_causal = structure == kMatmulCausalOut;
  if (k == 0 || (out_causal ? n != t : k != t)) return nullptr;
  const Layout amd = matmul_layout(a.shape, rank, attrs.flag & 1);
  const Layout bmd = matmul_layout(b.shape, rank, attrs.flag & 2);
  const Layout cmd = matmul_layout(cs, rank, false);
  std::vector<OnednnCausalMatmul::Block> blocks;
  std::string impl;
  try {
    omp_set_num_threads(1);
    for (int64_t r0 = 0; r0 < t; r0 += kCausalBlock) {
      const CausalBlock blk = causal_block(structure, r0, t, k, n);
      const auto [ao, ad] = sub_block(amd, r0, blk.rows, blk.p0, blk.p1 - blk.p0);
      const auto [bo, bd] = sub_block(bmd, blk.p0, blk.p1 - blk.p0, 0, blk.cols);
      const auto [co, cd] = sub_block(cmd, r0, blk.rows, 0, blk.cols);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), cpu_engine());
      if (impl.empty()) impl = impl_of(pd);
      blocks.push_back({dnnl::matmul(pd), ad, bd, cd, ao, bo, co, blk});
    }
  } catch (const dnnl::error& e) {
    spdlog::debug("onednn causal matmul {} x {} -> {}: {}; the plain kernel runs it", type_str(a), type_str(b),
                  type_str(out), e.what());
    return nullptr;
  }
  return std::make_shared<OnednnCausalMatmul>(std::move(blocks), numel(cs) / (t * n), t, n, impl);
}

std::shared_ptr<const PreparedKernel> make_onednn_conv(Op op, const Attrs& attrs,
                                                       std::span<const ValueType> ins,
                                                       const ValueType& out, ConvLayout layout) {
  const DataType dt = onednn_type(out.dtype);
  if (dt == DataType::undef || ins.size() != 2) return nullptr;
  const ConvShapes s = conv_shapes(op, ins, out);
  if (numel(s.x) == 0 || numel(s.w) == 0 || numel(s.y) == 0)
    return std::make_shared<ZeroProduct>();  // an empty sum, or nothing to write
  using Tag = dnnl::memory::format_tag;
  const dnnl::memory::desc x(s.x, dt, Tag::nchw), w(s.w, dt, Tag::oihw), y(s.y, dt, Tag::nchw);
  const bool any = layout == ConvLayout::kChosen;
  const dnnl::memory::desc xa = any ? dnnl::memory::desc(s.x, dt, Tag::any) : x;
  const dnnl::memory::desc wa = any ? dnnl::memory::desc(s.w, dt, Tag::any) : w;
  const dnnl::memory::desc ya = any ? dnnl::memory::desc(s.y, dt, Tag::any) : y;
  const int64_t* p = attrs.ints.data();  // stride_h, stride_w, pad_h, pad_w
  // Right padding = left: oneDNN checks (h - kh + pad_l + pad_r) / stride + 1 == oh with
  // integer division, which is the runtime's own output-size rule.
  const Dims strides{p[0], p[1]}, pad{p[2], p[3]};
  const auto direct = dnnl::algorithm::convolution_direct;
  try {
    omp_set_num_threads(1);  // primitives size their work split by the threads they may use
    const dnnl::convolution_forward::primitive_desc fwd(
        {dnnl::prop_kind::forward_training, direct, xa, wa, ya, strides, pad, pad}, cpu_engine());
    // The primitive over (in0, in1) -> out, each with the plain layout it has in the runtime.
    const auto made = [](dnnl::primitive prim, const dnnl::primitive_desc_base& pd, int in0,
                         const dnnl::memory::desc& md0, int in1, const dnnl::memory::desc& md1,
                         int out, const dnnl::memory::desc& md_out) {
      return std::make_shared<OnednnConv>(
          std::move(prim), impl_of(pd),
          std::vector{conv_operand(pd, in0, md0, false), conv_operand(pd, in1, md1, false),
                      conv_operand(pd, out, md_out, true)});
    };
    switch (op) {
      case Op::kConv2d:
        return made(dnnl::convolution_forward(fwd), fwd, DNNL_ARG_SRC, x, DNNL_ARG_WEIGHTS, w,
                    DNNL_ARG_DST, y);
      case Op::kConv2dGradInput: {
        const dnnl::convolution_backward_data::primitive_desc bwd(
            {direct, xa, wa, ya, strides, pad, pad}, cpu_engine(), fwd);
        return made(dnnl::convolution_backward_data(bwd), bwd, DNNL_ARG_DIFF_DST, y,
                    DNNL_ARG_WEIGHTS, w, DNNL_ARG_DIFF_SRC, x);
      }
      case Op::kConv2dGradWeight: {
        const dnnl::convolution_backward_weights::primitive_desc bwd(
            {direct, xa, wa, ya, strides, pad, pad}, cpu_engine(), fwd);
        return made(dnnl::convolution_backward_weights(bwd), bwd, DNNL_ARG_SRC, x,
                    DNNL_ARG_DIFF_DST, y, DNNL_ARG_DIFF_WEIGHTS, w);
      }
      default:
        XS_CHECK(false, "make_onednn_conv: {} is not a convolution", op_name(op));
    }
  } catch (const dnnl::error& e) {
    spdlog::debug("onednn {} {} -> {}: {}; the plain kernel runs it", op_name(op), type_str(ins[0]),
                  type_str(out), e.what());
    return nullptr;
  }
}

}  // namespace xs::detail
