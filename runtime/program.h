#pragma once
// A compiled graph: a list of kernels over planned storage, ready to run many times.
// Storage is one of: a graph input (maybe donated, then overwritten in place), a slot of
// the program's arena (intermediates, reused across runs), or an output buffer allocated
// per run and handed to the tensors.
//
//   std::shared_ptr<Program> p = compile_graph(graph);         // runtime/compiler/compile.h
//   std::vector<BufferPtr> outs = p->run(graph.inputs, env);   // one buffer per root

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "xla_spawn/runtime/buffer.h"
#include "xla_spawn/runtime/compiler/codegen.h"
#include "xla_spawn/runtime/kernels/kernels.h"
#include "xla_spawn/runtime/kernels/loop.h"
#include "xla_spawn/runtime/graph.h"

namespace xs {

// What the compiler did; tests assert on these.
struct CompileStats {
  int64_t nodes_in = 0;         // nodes in the cut graph (leaves included)
  int64_t folded = 0;           // nodes replaced by a constant or by an operand (x * 1)
  int64_t cse_merged = 0;       // nodes merged into an identical earlier node
  int64_t dce_removed = 0;      // nodes no root depends on any more
  int64_t nodes_out = 0;        // nodes left (leaves included)
  int64_t kernels = 0;          // kernels launched per run
  int64_t fused_loops = 0;      // loop kernels holding more than one elementwise op
  int64_t fused_ops = 0;        // elementwise ops inside those loops
  int64_t matmul_epilogues = 0; // matmuls with elementwise ops fused after the GEMM
  int64_t fused_reductions = 0; // sums, means, maxima, minima accumulated by their operand's loop
  int64_t gemm_accumulates = 0; // x * s + a b done as one GEMM with beta = s
  int64_t causal_products = 0;  // matmuls that skip a causal attention's masked blocks
  int64_t in_place = 0;         // outputs written over a dying input's storage
  int64_t donated_outputs = 0;  // roots written into a donated input buffer
  int64_t arena_bytes = 0;      // intermediate storage, after liveness-based reuse
  int64_t peak_live_bytes = 0;  // the most intermediate bytes live at once (arena's lower bound)
  int64_t views = 0;            // concat operands and slices made views (alias_views)
  int64_t gather_pieces = 0;    // slices of an all_gather's value it now writes (alias_views)
  int64_t native_loops = 0;     // loops (and epilogues) run as generated code
  int64_t native_functions = 0; // distinct functions among them (equal loops share one)
  int64_t interpreted_loops = 0; // loops left to the interpreter
};

struct Storage {
  // kView: `size_bytes` at `offset_bytes` into storage `index` (never itself a view).
  enum class Kind { kInput, kArena, kOutput, kView };
  Kind kind;
  int index;  // input index, arena slot, output slot, or (kView) the viewed storage
  size_t size_bytes;
  size_t offset_bytes = 0;
};

struct Kernel {
  enum class Kind { kLoop, kOp, kMatmul };  // kMatmul: GEMM, then `loop` as its epilogue
  // Where a kAllGather writes when its value is never stored whole (alias_views): bytes
  // [offset_bytes, offset_bytes + size_bytes) of the value go to all of `storage`.
  struct Piece {
    int storage;
    size_t offset_bytes;
    size_t size_bytes;
  };
  Kind kind = Kind::kOp;
  Op op = Op::kConst;
  Attrs attrs;
  std::vector<int> in_storage;
  std::vector<ValueType> in_types;
  int out_storage = -1;  // -1 when out_pieces is not empty
  ValueType out_type;
  std::vector<Piece> out_pieces;
  detail::LoopKernel loop;
  // kOp/kMatmul: made at compile for this op's types (detail::prepare_op_kernel, e.g. a
  // oneDNN bf16 primitive); runs instead of run_op_kernel. Null for most ops.
  std::shared_ptr<const detail::PreparedKernel> prepared;
};

class Program {
 public:
  std::vector<BufferPtr> run(std::span<const BufferPtr> inputs, const detail::ExecEnv& env);
  std::string text() const;

  CompileStats stats;
  std::vector<Storage> storages;
  std::vector<Kernel> kernels;
  std::vector<int> root_storage;  // per graph root
  std::vector<size_t> arena_slot_bytes;
  std::vector<size_t> output_bytes;
  std::vector<ValueType> input_types;  // checked on every run
  // Generated code for the loops, by kernel index (generate_native_code); null: interpreted.
  std::unique_ptr<detail::NativeLoops> native;

 private:
  // Arena slots that hold a collective's published operand (all_reduce's, reduce_scatter's or
  // all_gather's; directly or under views), found on first run.
  const std::vector<int>& collective_slots();

  std::vector<BufferPtr> arena_;  // allocated on first run, reused afterwards
  std::optional<std::vector<int>> collective_slots_;
};

}  // namespace xs
