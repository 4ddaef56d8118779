#include "xla_spawn/runtime/compiler/compile.h"

#include <algorithm>
#include <optional>
#include <string_view>

#include <spdlog/spdlog.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/compiler/codegen.h"
#include "xla_spawn/runtime/compiler/passes.h"

namespace xs {
std::shared_ptr<Program> compile_graph(const Graph& graph, const CompileOptions& options) {
  auto program = std::make_shared<Program>();
  {
    std::optional<ScopedTimer> timer;  // steps 1-3
    if (options.metrics != nullptr) timer.emplace(*options.metrics, kTimerCompilePassesTime);
    program->stats.nodes_in = static_cast<int64_t>(graph.nodes.size());
    for (const GNode& n : graph.nodes)
      if (n.op == Op::kData) program->input_types.resize(std::max<size_t>(program->input_types.size(), n.input + 1));
    for (const GNode& n : graph.nodes)
      if (n.op == Op::kData) program->input_types[n.input] = n.type;
    detail::Work work{graph.nodes, graph.roots};
    detail::fold_constants(work, program->stats);
    detail::eliminate_common_subexpressions(work, program->stats);
    detail::fuse_gemm_accumulate(work, program->stats);
    detail::fuse_pool_grad_mask(work);
    detail::fuse_pool_bias_relu(work);
    detail::fuse_conv_pool_grad(work);
    detail::fuse_conv_pool_forward(work);
    detail::eliminate_dead_code(work, program->stats);
    detail::mark_causal_products(work, program->stats);
    detail::lower_graph(work, graph.donated, *program);
    if (options.alias_views) alias_views(*program);
  }
  if (options.codegen) {
    std::optional<ScopedTimer> timer;  // step 4
    if (options.metrics != nullptr) timer.emplace(*options.metrics, kTimerCodegenTime);
    generate_native_code(*program, options.cache);
    if (options.metrics != nullptr) {
      const detail::NativeLoops::Source source =
          program->native ? program->native->source() : detail::NativeLoops::Source::kNone;
      if (source == detail::NativeLoops::Source::kCompiled) options.metrics->increment(kCounterNativeCompile);
      if (source == detail::NativeLoops::Source::kDiskCache) options.metrics->increment(kCounterPersistentCacheHit);
    }
  }
  return program;
}

void generate_native_code(Program& program, const detail::ObjectCache* cache) {
  std::vector<const detail::LoopKernel*> loops;
  for (const Kernel& k : program.kernels) loops.push_back(k.loop.steps.empty() ? nullptr : &k.loop);
  try {
    program.native = detail::compile_native_loops(loops, cache);
  } catch (const InternalError& e) {  // the interpreter is the reference: fall back, loudly
    spdlog::warn("runtime: native code failed ({}); this program's loops run on the interpreter", e.what());
    program.native.reset();
  }
  program.stats.native_loops = program.native ? program.native->compiled() : 0;
  program.stats.native_functions = program.native ? program.native->functions() : 0;
  program.stats.interpreted_loops = 0;
  for (size_t i = 0; i < loops.size(); ++i)
    program.stats.interpreted_loops += loops[i] != nullptr && !(program.native && program.native->fn(i));
}

}  // namespace xs
