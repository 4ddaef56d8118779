#include "replica/xm.h"

#include <cstdio>
#include <memory>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "collectives/local_communicator.h"
#include "collectives/shm_communicator.h"
#include "runtime/runtime.h"
#include "shm/segment.h"

namespace xs::xm {
namespace {

// One replica is one process: the state is per process, as torch_xla's is.
struct State {
  ReplicaContext context;
  std::unique_ptr<Communicator> communicator;
  bool debug_replicas = false;
};

std::unique_ptr<State>& state() {
  static std::unique_ptr<State> s;
  return s;
}

std::unique_ptr<Communicator> make_communicator(const ReplicaContext& ctx) {
  if (ctx.standalone() || ctx.world_size == 1) return std::make_unique<LocalCommunicator>();
  if (ctx.segment_name.empty()) {
    throw InvalidArgument(fmt::format(
        "xm::init: job '{}' has world size {} but {} is unset: start replicas with xla-spawn",
        ctx.job_id, ctx.world_size, env_names::kSegment));
  }
  Segment segment = Segment::attach(ctx.segment_name, ctx.ordinal, ctx.world_size, ctx.job_id);
  return std::make_unique<ShmCommunicator>(std::move(segment));
}

}  // namespace

void init() {
  if (state()) return;
  auto s = std::make_unique<State>();
  s->context = ReplicaContext::from_env();
  init_logging(fmt::format("ordinal {}", s->context.ordinal));
  s->communicator = make_communicator(s->context);
  s->debug_replicas = env_bool(kDebugReplicasEnv).value_or(false);
  runtime().set_communicator(s->communicator.get());
  state() = std::move(s);
}

void shutdown() {
  if (!state()) return;
  if (runtime().communicator() == state()->communicator.get()) runtime().set_communicator(nullptr);
  state().reset();
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
