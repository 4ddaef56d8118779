#pragma once
// What torch.distributed's gloo backend does for an all-reduce of a CPU tensor, as the
// baseline of the multi-node sweep: one gloo context over every replica of the job (gloo rank
// = global ordinal), connected as a full mesh through the job's rendezvous store, one TCP
// device on this node's address, and gloo::allreduce (ring, gloo::sum<float>). Replicas of one
// node talk over loopback TCP; nothing is shared memory.
//
//   xs::bench::FlatGloo flat(xs::ReplicaContext::from_env(), "bench-flat");  // collective
//   flat.all_reduce(data, n);                                                // f32 sum
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "xla_spawn/replica/context.h"

namespace gloo {
class Context;
}

namespace xs::bench {

class FlatGloo {
 public:
  // Every replica of a multi-node job calls this with the same `name`; the context's store
  // keys live under "<job id>/attempt-<k>/<name>". Throws xs::InvalidArgument when the job is
  // not multi-node or XLA_SPAWN_JOB_TOKEN is unset, xs::IoError / xs::Timeout when gloo
  // cannot listen or connect (within XLA_SPAWN_COLLECTIVE_TIMEOUT_MS).
  FlatGloo(const ReplicaContext& ctx, const std::string& name);
  ~FlatGloo();
  FlatGloo(const FlatGloo&) = delete;
  FlatGloo& operator=(const FlatGloo&) = delete;

  // In place, sum over every replica; gloo's ring (rank r sends to r + 1).
  void all_reduce(float* data, size_t n_elems);
  void barrier();
  // Wall time of connectFullMesh, in seconds.
  double connect_seconds() const { return connect_seconds_; }

 private:
  std::shared_ptr<gloo::Context> context_;
  double connect_seconds_ = 0;
};

}  // namespace xs::bench
