#include "xla_spawn/runtime/runtime.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/base/io.h"
#include "xla_spawn/base/running_graph.h"
#include "xla_spawn/base/trace.h"
#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/hash.h"
#include "xla_spawn/runtime/compiler/codegen.h"
#include "xla_spawn/runtime/compiler/compile.h"
#include "xla_spawn/runtime/program.h"

namespace xs {
namespace {

Runtime* g_current = nullptr;
constexpr const char* kGraphHashTag = "xs.runtime.graph_hash";

}  // namespace

RuntimeOptions RuntimeOptions::from_env() {
  RuntimeOptions o;
  o.compile_cache_size = env_int("XLA_SPAWN_COMPILE_CACHE_SIZE", 1, 1'000'000).value_or(o.compile_cache_size);
  o.dump_dir = env_string("XLA_SPAWN_DUMP_GRAPHS");
  o.warmup_steps = env_int("XLA_SPAWN_COMPILE_WARMUP_STEPS", 0, 1'000'000'000).value_or(o.warmup_steps);
  o.alias_views = env_bool("XLA_SPAWN_ALIAS_VIEWS").value_or(o.alias_views);
  o.codegen = env_bool("XLA_SPAWN_CODEGEN").value_or(o.codegen);
  o.compile_cache_dir = env_string("XLA_SPAWN_COMPILE_CACHE_DIR");
  o.compile_cache_max_mb = env_int("XLA_SPAWN_COMPILE_CACHE_MAX_MB", 1, 1'000'000).value_or(o.compile_cache_max_mb);
  o.ir_debug = env_bool("XLA_SPAWN_IR_DEBUG").value_or(o.ir_debug);
  o.explain_recompiles = env_bool("XLA_SPAWN_EXPLAIN_RECOMPILES").value_or(o.explain_recompiles);
  return o;
}

Runtime::Runtime(RuntimeOptions options)
    : options_(std::move(options)),
      cache_(static_cast<size_t>(options_.compile_cache_size)),
      history_(2 * static_cast<size_t>(options_.compile_cache_size)) {
  detail::init_blas_threads();
}

Runtime::~Runtime() {
  for (TensorImpl* impl : live_) impl->runtime = nullptr;
  scratch_.release();
}

void Runtime::set_communicator(Communicator* communicator) {
  if (communicator != communicator_) scratch_.release();
  communicator_ = communicator;
  scratch_.owner = communicator;
}

void* Runtime::Scratch::get(int index, size_t bytes) {
  const auto k = static_cast<size_t>(index);
  if (buffers_.size() <= k) buffers_.resize(k + 1, {nullptr, 0});
  auto& [data, size] = buffers_[k];
  if (size < bytes) {
    if (data != nullptr) owner->free_buffer(data);
    data = nullptr;
    size = 0;
    data = owner->alloc_buffer(bytes);
    size = bytes;
  }
  return data;
}

void Runtime::Scratch::release() {
  for (auto& [data, size] : buffers_) {
    if (data != nullptr) owner->free_buffer(data);
  }
  buffers_.clear();
}

void Runtime::register_tensor(TensorImpl* impl) { impl->registry_pos = live_.insert(live_.end(), impl); }
void Runtime::unregister_tensor(TensorImpl* impl) { live_.erase(impl->registry_pos); }

Tensor Runtime::next_seed() {
  seed_state_ += kSplitMix64Increment;
  const int64_t seed = static_cast<int64_t>(mix64(seed_state_));
  return Tensor::from_vector<int64_t>(std::vector<int64_t>{seed}, {});
}

void Runtime::mark_step() {
  metrics_.increment(kCounterMarkStep);
  std::vector<TensorImpl*> pending;
  // A tensor that is only a constant (zeros, ones) stays a constant: materialising it would
  // turn it into a data input next step and change the graph once for nothing.
  for (TensorImpl* impl : live_) if (impl->node && impl->node->op != Op::kConst) pending.push_back(impl);
  execute(std::move(pending), /*is_step=*/true);
}

void Runtime::sync(std::span<TensorImpl* const> tensors) {
  std::vector<TensorImpl*> pending;
  for (TensorImpl* impl : tensors) if (impl->node) pending.push_back(impl);
  if (pending.empty()) return;
  metrics_.increment(kCounterOpsOutsideGraph);
  execute(std::move(pending), /*is_step=*/false);
}

void Runtime::execute(std::vector<TensorImpl*> pending, bool is_step) {
  if (pending.empty()) return;
  if (is_step && trace_on.load(std::memory_order_relaxed) && last_step_end_ns_ != 0) {
    trace::record_between_steps("trace", last_step_end_ns_, trace::now_ns());
  }
  TraceScope span(is_step ? "mark_step" : "sync (host read)", "step");
  if (span.active()) span.arg("step", metrics_.counter(kCounterMarkStep));
  std::optional<TraceScope> cut_span(std::in_place, "cut and hash", "step");
  std::vector<NodePtr> roots;
  std::vector<int> owners;  // per root: the pending tensors holding it
  std::unordered_map<const Node*, size_t> root_of;
  for (TensorImpl* impl : pending) {
    const auto [it, added] = root_of.emplace(impl->node.get(), roots.size());
    if (added) {
      roots.push_back(impl->node);
      owners.push_back(0);
    }
    ++owners[it->second];
  }
  Graph graph = cut_graph(roots, /*allow_donation=*/is_step, owners);
  roots.clear();  // the graph's inputs and the tensors' nodes keep what is needed
  cut_span.reset();
  span.arg("graph", static_cast<int64_t>(graph.hash), /*hex=*/true);
  span.arg("nodes", static_cast<int64_t>(graph.nodes.size()));
  // Every collective call from here (the graph-hash check, the program's own) is this graph's.
  running_graph_hash.store(graph.hash, std::memory_order_relaxed);
  if (is_step) graph_steps.fetch_add(1, std::memory_order_relaxed);
  struct Done {  // on every exit path
    ~Done() { running_graph_hash.store(0, std::memory_order_relaxed); }
  } done;
  const bool check_skipped = check_same_graph_everywhere(graph);
  std::shared_ptr<Program> program = lookup_or_compile(graph, is_step);
  // From here the run may overwrite its donated inputs: IR still holding them (autograd's
  // saved values) is stale, whether the run succeeds or not.
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    if (graph.donated[i]) graph.inputs[i]->bump_version();
  }
  std::vector<BufferPtr> outputs;
  try {
    try {
      ScopedTimer timer(metrics_, kTimerExecuteTime);
      TraceScope run_span("run", "step");
      const bool collective = communicator_ != nullptr && communicator_->world_size() > 1;
      outputs = program->run(graph.inputs,
                             {communicator_, &metrics_, collective ? &scratch_ : nullptr});
    } catch (const PeerFailure& e) {
      if (!check_skipped) throw;
      // The error first: most often a peer failed, and the hint only says where to look when
      // the replicas' calls did not match.
      throw PeerFailure(fmt::format(
          "{} (if the calls mismatched, a peer's graph may have changed: graph {:016x} is the "
          "one every replica agreed on at the last check, so this replica skipped the check, "
          "and such a peer waits in its graph-hash rendezvous)",
          e.what(), graph.hash));
    }
  } catch (const std::exception& e) {
    mark_lost(graph, pending, root_of, e.what());
    throw;
  }
  for (TensorImpl* impl : pending) {
    impl->data = outputs[root_of.at(impl->node.get())];
    impl->node = nullptr;
    impl->leaf = nullptr;
  }
  last_stats_ = program->stats;
  last_hash_ = graph.hash;
  if (is_step && span.active()) last_step_end_ns_ = trace::now_ns();
}

// A run that failed may have overwritten some of its donated inputs already (an updated
// parameter reuses its old buffer). Running the pending values again would apply such updates
// twice, so every pending tensor computed from a donated input is marked lost; the others
// stay pending and may run again.
void Runtime::mark_lost(const Graph& graph, std::span<TensorImpl* const> pending,
                        const std::unordered_map<const Node*, size_t>& root_of, const char* what) {
  // graph.nodes are in post-order: a node's operands come before it.
  std::vector<uint8_t> depends(graph.nodes.size(), 0);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const GNode& g = graph.nodes[i];
    const auto operand_depends = [&](int o) { return depends[static_cast<size_t>(o)] != 0; };
    depends[i] = g.op == Op::kData
                     ? graph.donated[static_cast<size_t>(g.input)]
                     : std::any_of(g.operands.begin(), g.operands.end(), operand_depends);
  }
  const auto message = std::make_shared<const std::string>(fmt::format(
      "this tensor's value was lost: the step that computed it failed ({}), and buffers it is "
      "computed from were given to that step to overwrite in place; assign the tensor a new "
      "value (for example from a checkpoint)",
      what));
  for (TensorImpl* impl : pending) {
    const int root = graph.roots[root_of.at(impl->node.get())];
    if (!depends[static_cast<size_t>(root)]) continue;
    impl->lost = message;
    impl->node = nullptr;
    impl->leaf = nullptr;
    impl->data = nullptr;
  }
}

bool Runtime::check_same_graph_everywhere(const Graph& graph) {
  if (communicator_ == nullptr || communicator_->world_size() == 1) return false;
  const bool collective = std::any_of(graph.nodes.begin(), graph.nodes.end(),
                                      [](const GNode& n) { return op_info(n.op).kind == OpKind::kCollective; });
  if (!collective) return false;  // only a graph with collectives must match across replicas
  // Every replica agreed on checked_hash_ at the last check. A replica whose graph is still
  // that one skips the rendezvous; one whose graph changed runs it, and then the first
  // collective of the two disagrees (all_reduce against rendezvous), which the communicator's
  // call-header check turns into a PeerFailure before any data is exchanged.
  if (graph.hash == checked_hash_) return true;
  std::byte payload[sizeof(uint64_t)];
  std::memcpy(payload, &graph.hash, sizeof payload);
  metrics_.increment(kCounterGraphHashCheck);
  std::vector<std::vector<std::byte>> all;
  try {
    ScopedTimer timer(metrics_, kTimerGraphHashCheckTime);
    all = communicator_->rendezvous(kGraphHashTag, payload);
  } catch (const PeerFailure& e) {
    throw PeerFailure(fmt::format(
        "mark_step: graph-hash check failed: this replica's graph changed to {:016x} (the last one "
        "every replica agreed on was {:016x}); a peer whose graph did not change skips the check "
        "and calls its all_reduce instead. Every replica must trace the same step: {}",
        graph.hash, checked_hash_, e.what()));
  }
  for (size_t k = 0; k < all.size(); ++k) {
    uint64_t theirs = 0;
    if (all[k].size() == sizeof theirs) std::memcpy(&theirs, all[k].data(), sizeof theirs);
    if (theirs != graph.hash) {
      throw PeerFailure(fmt::format(
          "mark_step: graph hash mismatch: ordinal {} traced {:016x}, ordinal {} traced {:016x}; every "
          "replica must trace the same step (same shapes, ops and order) before its all_reduce",
          communicator_->ordinal(), graph.hash, k, theirs));
    }
  }
  checked_hash_ = graph.hash;
  return false;
}

std::shared_ptr<Program> Runtime::lookup_or_compile(const Graph& graph, bool is_step) {
  if (std::shared_ptr<Program> hit = cache_.find(graph.hash)) {
    metrics_.increment(kCounterCachedCompile);
    history_.touch(graph.hash);
    return hit;
  }
  metrics_.increment(kCounterUncachedCompile);
  std::shared_ptr<Program> program;
  if (options_.codegen && !jit_started_) {
    ScopedTimer start(metrics_, kTimerCodegenStartTime);
    detail::start_native_jit();
    jit_started_ = true;
  }
  {
    ScopedTimer timer(metrics_, kTimerCompileTime);
    TraceScope span("compile", "compile");
    span.arg("graph", static_cast<int64_t>(graph.hash), /*hex=*/true);
    span.arg("nodes", static_cast<int64_t>(graph.nodes.size()));
    if (options_.codegen && options_.compile_cache_dir && !disk_cache_) {
      disk_cache_ = std::make_unique<detail::ObjectCache>(
          *options_.compile_cache_dir, static_cast<uint64_t>(options_.compile_cache_max_mb) << 20);
    }
    program = compile_graph(graph, {.alias_views = options_.alias_views,
                                    .codegen = options_.codegen,
                                    .cache = disk_cache_.get(),
                                    .metrics = &metrics_});
  }
  cache_.insert(graph.hash, program);
  GraphSummary summary =
      summarize(graph, metrics_.counter(kCounterMarkStep), is_step, options_.ir_debug);
  note_compile(summary);
  history_.insert(std::move(summary));
  if (options_.dump_dir) dump(graph, *program);
  return program;
}

void Runtime::note_compile(const GraphSummary& summary) {
  const bool late = metrics_.counter(kCounterMarkStep) > options_.warmup_steps;
  if (late) late_compiles_.push_back(summary.hash);
  const bool warn_now =
      late && !warned_ &&
      static_cast<int64_t>(late_compiles_.size()) >= options_.recompile_warning_threshold;
  std::string why;
  if (options_.explain_recompiles || warn_now) {
    if (const GraphSummary* closest = history_.closest(summary))
      why = explain_recompile(*closest, summary);
  }
  if (!warn_now) {
    if (options_.explain_recompiles && !why.empty()) spdlog::warn("runtime: {}", why);
    return;
  }
  warned_ = true;
  std::string hashes;
  for (uint64_t h : late_compiles_) hashes += fmt::format("{}{:016x}", hashes.empty() ? "" : ", ", h);
  spdlog::warn(
      "runtime: {} graphs compiled after warm-up (step {} > {} warm-up steps), hashes [{}]: a "
      "shape, dtype or graph structure keeps changing between steps (dynamic shapes, a "
      "Python-style value baked in as a constant, or a host read mid-step). Set "
      "XLA_SPAWN_DUMP_GRAPHS=dir to compare them, XLA_SPAWN_EXPLAIN_RECOMPILES=1 to explain "
      "each.{}{}",
      late_compiles_.size(), metrics_.counter(kCounterMarkStep), options_.warmup_steps, hashes,
      why.empty() ? "" : " The last: ", why);
}

// The first dump failing is a bad setting, found at the first compile; a later one (the disk
// filled up) must not end a run for a debugging aid: it is said once and dumping stops.
void Runtime::dump(const Graph& graph, const Program& program) const {
  if (dump_failed_) return;
  std::string failure;
  std::error_code ec;
  const std::string link = foreign_symlink(*options_.dump_dir);
  if (link.empty()) std::filesystem::create_directories(*options_.dump_dir, ec);
  const std::string base = fmt::format("{}/graph_{:016x}", *options_.dump_dir, graph.hash);
  if (!link.empty()) {
    failure = fmt::format(
        "the directory is reached through {}, whose owner could point it anywhere; give its real path if "
        "you trust them",
        link);
  } else if (ec) {
    failure = "cannot create the directory: " + ec.message();
  } else if (!write_file_atomically(base + ".txt", {graph_text(graph), program.text()}, 0644)) {
    failure = errno_message("writing " + base + ".txt", errno);
  } else if (!write_file_atomically(base + ".dot", {graph_dot(graph)}, 0644)) {
    failure = errno_message("writing " + base + ".dot", errno);
  }
  if (failure.empty()) {
    ++graphs_dumped_;
    return;
  }
  const std::string what = fmt::format("XLA_SPAWN_DUMP_GRAPHS={}: {}", *options_.dump_dir, failure);
  if (graphs_dumped_ == 0) throw IoError(what);
  dump_failed_ = true;
  spdlog::warn("{}; dumping stops after {} graph(s)", what, graphs_dumped_);
}

Runtime& runtime() {
  if (g_current == nullptr) {
    static Runtime default_runtime;
    g_current = &default_runtime;
  }
  return *g_current;
}

ScopedRuntime::ScopedRuntime(RuntimeOptions options) : runtime_(std::move(options)), previous_(&runtime()) {
  g_current = &runtime_;
}

ScopedRuntime::~ScopedRuntime() { g_current = previous_; }

void mark_step() { runtime().mark_step(); }
std::string metrics_report() { return runtime().metrics().report(); }

}  // namespace xs
