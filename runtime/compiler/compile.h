#pragma once
// The compiler's entry point: a cut graph in, a Program out, every step in the order below.
//
//   std::shared_ptr<Program> p = compile_graph(graph, {.alias_views = true, .codegen = true});
//
// 1. Graph passes (passes.cpp): constant folding, CSE, the accumulating GEMM, the max-pool
//    gradient's ReLU mask, pool-before-bias-and-ReLU, the conv gradients fed the pool
//    gradient's operands, the conv-bias-ReLU-pool layer as one kernel, dead-code elimination,
//    causal attention's products marked to skip their masked blocks.
// 2. Lowering (lower.cpp): elementwise fusion into loops and matmul epilogues, storage plan.
// 3. View aliasing (alias_views.cpp), when asked: copies the plan made avoidable go.
// 4. Native code (codegen.cpp), when asked: the loops compiled by LLVM, or loaded from the
//    persistent cache (object_cache.h).

#include <memory>

#include "xla_spawn/runtime/compiler/object_cache.h"
#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/metrics.h"
#include "xla_spawn/runtime/program.h"

namespace xs {

struct CompileOptions {
  bool alias_views = false;
  bool codegen = false;
  const detail::ObjectCache* cache = nullptr;  // with codegen: the persistent cache, if any
  // Receives CompilePassesTime (steps 1-3) and CodegenTime (step 4), and NativeCompile or
  // PersistentCacheHit, when set.
  Metrics* metrics = nullptr;
};

std::shared_ptr<Program> compile_graph(const Graph& graph, const CompileOptions& options = {});

// Step 3 alone. Removes copies the buffer plan made avoidable (the flatten / all-reduce /
// unflatten of gradients is the case in point): a concat along axis 0 whose operands exist
// only for it gets its producers writing straight into a fresh buffer at their offsets, and a
// contiguous slice becomes a view while the sliced buffer stays unchanged; an all_gather whose
// value is only sliced into non-arena storage (a sharded update's gathered parameters) writes
// those slices itself. Results are unchanged; each removed kernel counts in stats.views (the
// all_gather's slices also in stats.gather_pieces). Idempotent.
void alias_views(Program& program);

// Step 4 alone: the program's loop kernels and matmul epilogues as native code (last, since
// it fixes the storage each loop reads and writes). Loops without a generated form stay
// interpreted; both count in stats. With a usable `cache`, the object comes from there when
// present and goes there when made.
void generate_native_code(Program& program, const detail::ObjectCache* cache = nullptr);

}  // namespace xs
