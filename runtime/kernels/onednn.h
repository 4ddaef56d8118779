#pragma once
// bf16 matmul and convolution on oneDNN's primitives: bf16 operands, f32 accumulation, each
// result rounded once (to nearest even) to bf16. A primitive is made once per op and shape,
// when a program is compiled (prepare_op_kernel), and the program's kernel holds it.
//
//   std::shared_ptr<const PreparedKernel> mm = make_onednn_matmul(attrs, a, b, out);
//   if (mm) mm->run(args, out_arg);   // null: this op keeps its plain kernel

#include <memory>
#include <span>

#include "xla_spawn/runtime/kernels/kernels.h"

namespace xs::detail {

// Which engine runs bf16 matmul and convolution, from XLA_SPAWN_BF16_ENGINE (read per call;
// the compiler asks once per program):
// auto (oneDNN where the CPU has AVX512_BF16 or AMX, else convert + sgemm), onednn (always
// oneDNN, which emulates bf16 on older AVX-512 CPUs), convert (bf16 widened to f32, the f32
// kernels, one rounding back). Throws InvalidArgument on any other value.
bool use_onednn_bf16();

// Whether oneDNN's effective ISA on this CPU has native bf16 dot products (AVX512_BF16, AMX).
bool cpu_has_bf16_dot();

// out = op(a) op(b) as matmul_kernel defines it (batched, broadcast batch, transpose flags in
// attrs.flag), for dtype bf16 or f32. Null when oneDNN cannot make the primitive.
std::shared_ptr<const PreparedKernel> make_onednn_matmul(const Attrs& attrs, const ValueType& a,
                                                         const ValueType& b, const ValueType& out);

// A f32 matmul with a causal structure bit (kernels.h, kMatmulCausalOut...) and batch dims:
// one primitive per row block over the whole batch. Null when it does not apply or oneDNN
// cannot make the primitives.
std::shared_ptr<const PreparedKernel> make_onednn_causal_matmul(const Attrs& attrs, const ValueType& a,
                                                                const ValueType& b, const ValueType& out);

// Where a convolution primitive works: on the runtime's NCHW/OIHW buffers as they are
// (oneDNN then runs im2col + GEMM), or in the layouts oneDNN chooses (blocked channels, for
// its direct JIT kernels), the operands reordered into and out of per-thread scratch.
enum class ConvLayout { kPlain, kChosen };

// conv2d (ins {x, w}), conv2d_grad_input ({grad_out, w}) or conv2d_grad_weight ({x,
// grad_out}) with the op's attrs, bf16 or f32. Null when oneDNN cannot make the primitive, or
// for the compiler's fused forms (more operands).
std::shared_ptr<const PreparedKernel> make_onednn_conv(Op op, const Attrs& attrs,
                                                       std::span<const ValueType> ins,
                                                       const ValueType& out, ConvLayout layout);

}  // namespace xs::detail
