#pragma once
// The per-replica lazy runtime: the registry of live tensors, mark_step(), the compile cache,
// metrics, the in-graph RNG seed stream and the communicator for in-graph all_reduce.
// There is always a current runtime; tests install a fresh one with ScopedRuntime so no
// state (cache, counters, tensors) leaks between them.
//
//   ScopedRuntime rt;                 // fresh runtime, restored on scope exit
//   Tensor w = ...; w.assign(w - lr * grad);
//   mark_step();                      // compile (or look up) and run the step
//   std::cout << metrics_report();
//
// Options from the environment: XLA_SPAWN_COMPILE_CACHE_SIZE (programs kept, default 64),
// XLA_SPAWN_DUMP_GRAPHS=dir (write each compiled graph as <dir>/graph_<hash>.{txt,dot}),
// XLA_SPAWN_COMPILE_WARMUP_STEPS (steps after which new compiles are suspicious, default 5),
// XLA_SPAWN_ALIAS_VIEWS=0 (keep concat and slice copies, to measure what the views save),
// XLA_SPAWN_IR_DEBUG=1 (each IR node keeps the source line that recorded it: runtime/site.h),
// XLA_SPAWN_EXPLAIN_RECOMPILES=1 (warn with the cause of every recompile: runtime/explain.h).

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xla_spawn/runtime/compile_cache.h"
#include "xla_spawn/runtime/explain.h"
#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/kernels/kernels.h"
#include "xla_spawn/runtime/metrics.h"
#include "xla_spawn/runtime/tensor.h"

namespace xs {

class Communicator;

struct RuntimeOptions {
  int64_t compile_cache_size = 64;
  std::optional<std::string> dump_dir;
  int64_t warmup_steps = 5;
  // Compiles after warm-up before the (single) warning fires.
  int64_t recompile_warning_threshold = 3;
  // Run alias_views on every compiled program (concat/slice copies become views).
  bool alias_views = true;
  // Compile loop kernels to native code (XLA_SPAWN_CODEGEN; 0 keeps the interpreter).
  bool codegen = true;
  // The persistent compile cache's directory (XLA_SPAWN_COMPILE_CACHE_DIR); unset: none.
  std::optional<std::string> compile_cache_dir;
  // Its size, in MiB (XLA_SPAWN_COMPILE_CACHE_MAX_MB): past it, the least recently used go.
  int64_t compile_cache_max_mb = 256;
  // Keep each recorded op's source line (XLA_SPAWN_IR_DEBUG) for explanations and dumps.
  bool ir_debug = false;
  // Explain every compile that has a kept neighbour, not only in the recompile warning
  // (XLA_SPAWN_EXPLAIN_RECOMPILES).
  bool explain_recompiles = false;

  static RuntimeOptions from_env();
};

class Runtime {
 public:
  explicit Runtime(RuntimeOptions options = RuntimeOptions::from_env());
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Cuts the pending IR of every live tensor, compiles or looks it up, runs it, and makes
  // every live pending tensor materialised.
  void mark_step();
  // Materialises just `tensors` (a host read); counted in OpsOutsideGraph, not MarkStep.
  void sync(std::span<TensorImpl* const> tensors);

  Metrics& metrics() { return metrics_; }
  const Metrics& metrics() const { return metrics_; }
  CompileCache& cache() { return cache_; }
  const RuntimeOptions& options() const { return options_; }
  // Stats of the program run by the most recent step or sync.
  const CompileStats& last_stats() const { return last_stats_; }
  uint64_t last_graph_hash() const { return last_hash_; }
  bool recompile_warning_issued() const { return warned_; }

  // In-graph all_reduce calls this communicator; null (the default) makes it a no-op. The
  // operands of in-graph all-reduces live in memory from its alloc_buffer(), returned when the
  // communicator is replaced or the runtime destroyed: a communicator must outlive the runtime
  // or be unset (set_communicator(nullptr)) before it is destroyed, as xm::shutdown() does.
  void set_communicator(Communicator* communicator);
  Communicator* communicator() const { return communicator_; }

  // Seeds for in-graph RNG ops: each call returns a fresh i64 scalar data tensor, so a new
  // seed never changes the graph hash.
  void manual_seed(uint64_t seed) { seed_state_ = seed; }
  Tensor next_seed();

  size_t live_tensors() const { return live_.size(); }
  void register_tensor(TensorImpl* impl);
  void unregister_tensor(TensorImpl* impl);

 private:
  void execute(std::vector<TensorImpl*> pending, bool is_step);
  std::shared_ptr<Program> lookup_or_compile(const Graph& graph, bool is_step);
  // Counts a compile towards the recompile warning and logs the explanations due (history_
  // does not hold `summary` yet).
  void note_compile(const GraphSummary& summary);
  // With a communicator of world size > 1 and an all_reduce in `graph`: every replica must
  // have traced the same graph; a mismatch throws PeerFailure naming both hashes and ordinals.
  // The rendezvous runs only when the graph differs from the last one checked (a step that
  // repeats the graph pays no extra collective). Returns true when the check was skipped.
  bool check_same_graph_everywhere(const Graph& graph);
  // After `graph`'s run failed with `what`: marks the pending tensors computed from its
  // donated inputs lost (TensorImpl::lost).
  // root_of: each pending tensor's node -> its index in graph.roots.
  static void mark_lost(const Graph& graph, std::span<TensorImpl* const> pending,
                        const std::unordered_map<const Node*, size_t>& root_of, const char* what);
  void dump(const Graph& graph, const Program& program) const;

  // All-reduce operand buffers from the communicator, shared by every program (an arena slot
  // holds nothing between runs); index k is a program's k-th operand slot.
  class Scratch : public detail::CollectiveScratch {
   public:
    void* get(int index, size_t bytes) override;
    void release();  // returns every buffer to `owner`
    Communicator* owner = nullptr;

   private:
    std::vector<std::pair<void*, size_t>> buffers_;
  };

  RuntimeOptions options_;
  Scratch scratch_;
  std::list<TensorImpl*> live_;  // creation order: deterministic graph order across steps
  CompileCache cache_;
  std::unique_ptr<detail::ObjectCache> disk_cache_;  // made at the first native compile
  bool jit_started_ = false;
  Metrics metrics_;
  CompileStats last_stats_;
  uint64_t last_hash_ = 0;
  uint64_t checked_hash_ = 0;  // the graph every replica agreed on at the last check (0: none)
  int64_t last_step_end_ns_ = 0;  // when the last traced mark_step ended (the timeline's "trace")
  Communicator* communicator_ = nullptr;
  uint64_t seed_state_ = 0x853c49e6748fea9bull;  // PCG's default increment: any odd constant
  std::vector<uint64_t> late_compiles_;          // hashes compiled after warm-up
  bool warned_ = false;
  mutable int graphs_dumped_ = 0;
  mutable bool dump_failed_ = false;  // a dump after the first failed: no more are tried
  GraphHistory history_;  // summaries of compiled graphs, for the recompile explanations
};

// The current runtime (a process-wide default until a ScopedRuntime installs another).
Runtime& runtime();

// Installs a fresh runtime for its lifetime and restores the previous one afterwards.
class ScopedRuntime {
 public:
  explicit ScopedRuntime(RuntimeOptions options = RuntimeOptions::from_env());
  ~ScopedRuntime();
  ScopedRuntime(const ScopedRuntime&) = delete;
  ScopedRuntime& operator=(const ScopedRuntime&) = delete;
  Runtime& get() { return runtime_; }
  Runtime* operator->() { return &runtime_; }

 private:
  Runtime runtime_;
  Runtime* previous_;
};

void mark_step();
std::string metrics_report();

}  // namespace xs
