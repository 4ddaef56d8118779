#include "xla_spawn/replica/xm.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/base/log.h"
#include "xla_spawn/base/trace.h"
#include "xla_spawn/cluster/job_token.h"
#include "xla_spawn/cluster/store_client.h"
#include "xla_spawn/collectives/local_communicator.h"
#include "xla_spawn/collectives/multi_host_communicator.h"
#include "xla_spawn/collectives/shm_communicator.h"
#include "xla_spawn/runtime/runtime.h"
#include "xla_spawn/shm/segment.h"
#include "xla_spawn/shm/wait.h"

namespace xs::xm {
namespace {

// One replica is one process: the state is per process, as torch_xla's is.
struct State {
  ReplicaContext context;
  std::unique_ptr<Communicator> communicator;
  bool debug_replicas = false;
  pid_t pid = 0;  // the process that made it: a forked child inherits it
};

// The same replica of the same job: what a forked child's environment says of it when the
// child has its parent's environment.
bool same_replica(const ReplicaContext& a, const ReplicaContext& b) {
  return a.job_id == b.job_id && a.attempt == b.attempt && a.ordinal == b.ordinal &&
         a.world_size == b.world_size && a.segment_name == b.segment_name;
}

std::unique_ptr<State>& state() {
  static std::unique_ptr<State> s;
  return s;
}

// This node's communicator over its segment (replicas of this node only).
std::unique_ptr<ShmCommunicator> node_communicator(const ReplicaContext& ctx) {
  if (ctx.segment_name.empty()) {
    throw InvalidArgument(fmt::format(
        "xm::init: job '{}' has {} replicas on this node but {} is unset: start replicas with "
        "xla-spawn",
        ctx.job_id, ctx.local_world_size, env_names::kSegment));
  }
  Segment segment = Segment::attach(ctx.segment_name, ctx.local_ordinal, ctx.local_world_size,
                                    ctx.segment_key());
  return std::make_unique<ShmCommunicator>(std::move(segment));
}

// Shared memory inside the node, gloo between nodes; gloo's contexts meet through the
// rendezvous server's store, under a prefix of this job and attempt.
std::unique_ptr<Communicator> multi_node_communicator(const ReplicaContext& ctx) {
  const auto token_text = env_string(cluster::kJobTokenEnv);
  if (!token_text) {
    throw InvalidArgument(fmt::format("xm::init: node {} of a {}-node job without {}: start "
                                      "replicas with xla-spawn",
                                      ctx.node, ctx.nnodes, cluster::kJobTokenEnv));
  }
  const std::chrono::milliseconds timeout(collective_timeout_ms_from_env());
  auto store = std::make_shared<cluster::StoreClient>(
      ctx.master_addr, static_cast<uint16_t>(ctx.master_port),
      cluster::JobToken(*token_text, cluster::kJobTokenEnv), timeout);
  // A node of one replica attaches too: its segment keeps the hang report's records.
  std::unique_ptr<ShmCommunicator> local;
  if (ctx.local_world_size > 1 || !ctx.segment_name.empty()) local = node_communicator(ctx);
  MultiHostCommunicatorOptions options;
  options.prefix = fmt::format("{}/attempt-{}", ctx.job_id, ctx.attempt);
  return std::make_unique<MultiHostCommunicator>(
      NodeTopology(ctx.node_sizes, ctx.node, ctx.local_ordinal), std::move(local), std::move(store),
      ctx.host_addr, options);
}

std::unique_ptr<Communicator> make_communicator(const ReplicaContext& ctx) {
  if (ctx.standalone() || ctx.world_size == 1) return std::make_unique<LocalCommunicator>();
  if (ctx.multi_node()) return multi_node_communicator(ctx);
  return node_communicator(ctx);
}

}  // namespace

void init() {
  if (state() && state()->pid == ::getpid()) return;
  if (state()) {
    // Inherited through a fork. A child with its parent's environment keeps it (its
    // collectives are refused as a forked child's); one given a replica environment of its
    // own (spawn(fn)'s children, forked after the parent's init) would otherwise run as its
    // parent, alone in a world of one, its collectives doing nothing. The parent's objects
    // are the parent's: forgotten here, not torn down.
    if (same_replica(ReplicaContext::from_env(), state()->context)) return;
    runtime().set_communicator(nullptr);
    [[maybe_unused]] State* parents = state().release();
  }
  auto s = std::make_unique<State>();
  s->pid = ::getpid();
  s->context = ReplicaContext::from_env();
  init_logging(fmt::format("ordinal {}", s->context.ordinal));
  trace::start_from_env(s->context.ordinal, s->context.attempt);
  s->communicator = make_communicator(s->context);
  s->debug_replicas = env_bool(kDebugReplicasEnv).value_or(false);
  runtime().set_communicator(s->communicator.get());
  state() = std::move(s);
}

void shutdown() {
  if (!state()) return;
  trace::flush();
  if (runtime().communicator() == state()->communicator.get()) runtime().set_communicator(nullptr);
  state().reset();
}

void abandon() {
  if (!state()) return;
  trace::flush();
  runtime().set_communicator(nullptr);
  [[maybe_unused]] State* leaked = state().release();
}

bool initialized() {
  return state() != nullptr;
}

const ReplicaContext& context() {
  if (!state()) throw InternalError("xm: call xs::xm::init() before using the replica API");
  return state()->context;
}

Communicator& communicator() {
  context();
  return *state()->communicator;
}

int ordinal() {
  return context().ordinal;
}
int local_ordinal() {
  return context().local_ordinal;
}
int world_size() {
  return context().world_size;
}
bool is_master(bool local) {
  return local ? context().is_local_master() : context().is_master();
}
bool debug_replicas() {
  return context(), state()->debug_replicas;
}

void master_print_line(const std::string& line) {
  if (!is_master()) return;
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace xs::xm
