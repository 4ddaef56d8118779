// spawn(fn) from a program outside the xla-spawn tree (xla_spawn::launcher alone): two
// children, each told its place by ReplicaContext::from_env(), supervised as by xla-spawn.
//   /tmp/app/spawn_replicas    (no launcher needed: it is one)

#include <cstdio>

#include "xla_spawn/launcher/spawn.h"
#include "xla_spawn/replica/context.h"

int main() {
  const xs::JobResult result = xs::spawn(
      [](int) {
        const xs::ReplicaContext ctx = xs::ReplicaContext::from_env();
        std::printf("child %d of %d\n", ctx.ordinal, ctx.world_size);
      },
      2);
  std::printf("spawn: exit code %d\n", result.exit_code);
  return result.exit_code;
}
