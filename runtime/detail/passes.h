#pragma once
// Graph-level compiler passes over a cut Graph: constant folding (with the identities
// x*1, x+0, x-0, x/1 and no-op casts/reshapes), common-subexpression elimination and
// dead-code elimination. Each rewrites `nodes`/`roots` and records what it did in `stats`.

#include <vector>

#include "runtime/graph.h"
#include "runtime/program.h"

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

}  // namespace xs::detail
