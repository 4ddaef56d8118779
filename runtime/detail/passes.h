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

}  // namespace xs::detail
