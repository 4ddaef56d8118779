// The smallest ordinal-aware binary: each replica says who it is, the master summarises.
// Runs alone (ordinal 0 of 1) or under the launcher:  xla-spawn -n 4 -- hello_replicas

#include <cstdlib>
#include <exception>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/base/log.h"
#include "xla_spawn/replica/context.h"

int main() try {
  const xs::ReplicaContext ctx = xs::ReplicaContext::from_env();
  xs::init_logging(fmt::format("ordinal {}", ctx.ordinal));
  spdlog::info("replica {} of {} (local {} of {}), job '{}', attempt {}", ctx.ordinal,
               ctx.world_size, ctx.local_ordinal, ctx.local_world_size,
               ctx.standalone() ? "standalone" : ctx.job_id, ctx.attempt);
  if (ctx.is_master()) spdlog::info("master: {} replicas started", ctx.world_size);
  return EXIT_SUCCESS;
} catch (const xs::InvalidArgument& e) {  // a bad environment: a usage error, as the trainers'
  fmt::print(stderr, "hello_replicas: {}\n", e.what());
  return 2;
} catch (const std::exception& e) {
  fmt::print(stderr, "hello_replicas: {}\n", e.what());
  return EXIT_FAILURE;
}
