#include "bench/cluster/flat_gloo.h"

#include <fmt/format.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/cluster/job_token.h"
#include "xla_spawn/cluster/store_client.h"
#include "xla_spawn/shm/wait.h"

namespace xs::bench {

FlatGloo::FlatGloo(const ReplicaContext& ctx, const std::string& name) {
  if (!ctx.multi_node()) {
    throw InvalidArgument(
        fmt::format("flat gloo: ordinal {} is in a job of {} node(s); start "
                    "one xla-spawn per node with --nnodes >= 2",
                    ctx.ordinal, ctx.nnodes));
  }
  const auto token_text = env_string(cluster::kJobTokenEnv);
  if (!token_text) {
    throw InvalidArgument(fmt::format("flat gloo: {} is unset: start replicas with xla-spawn",
                                      cluster::kJobTokenEnv));
  }
  const std::chrono::milliseconds timeout(collective_timeout_ms_from_env());
  cluster::StoreClient store(ctx.master_addr, static_cast<uint16_t>(ctx.master_port),
                             cluster::JobToken(*token_text, cluster::kJobTokenEnv), timeout);
  gloo::rendezvous::PrefixStore prefixed(
      fmt::format("{}/attempt-{}/{}", ctx.job_id, ctx.attempt, name), store);
  gloo::transport::tcp::attr attr;
  attr.hostname = ctx.host_addr;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw IoError(
        fmt::format("flat gloo: no gloo device on address '{}': {}", ctx.host_addr, e.what()));
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    auto context = std::make_shared<gloo::rendezvous::Context>(ctx.ordinal, ctx.world_size);
    context->setTimeout(timeout);
    context->connectFullMesh(prefixed, device);
    context_ = std::move(context);
  } catch (const gloo::Exception& e) {
    throw PeerFailure(fmt::format("flat gloo: ordinal {} of {} on {}: connectFullMesh: {}",
                                  ctx.ordinal, ctx.world_size, ctx.host_addr, e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    throw PeerFailure(fmt::format("flat gloo: ordinal {} of {} on {}: connectFullMesh: {}",
                                  ctx.ordinal, ctx.world_size, ctx.host_addr, e.what()));
  }
  connect_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

FlatGloo::~FlatGloo() = default;

void FlatGloo::all_reduce(float* data, size_t n_elems) {
  if (n_elems == 0) return;
  gloo::AllreduceOptions options(context_);
  options.setOutput(data, n_elems);
  // torch's ProcessGroupGloo passes the same function for a float SUM.
  options.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  gloo::allreduce(options);
}

void FlatGloo::barrier() {
  gloo::BarrierOptions options(context_);
  gloo::barrier(options);
}

}  // namespace xs::bench
