// What a fork costs a replica that holds registered memory: the fork handlers copy every
// registered byte for the child (docs/python.md). Times `--forks` fork + child _exit + waitpid
// with a buffer of `--mib` MiB, first unregistered, then registered, and prints the medians. Run it as a replica; a buffer larger than the arena
// (256 MiB by default) needs XLA_SPAWN_ARENA_BYTES raised:
//
//   xla-spawn -n 2 -- build/bench/collectives/fork_cost --mib 64 --forks 20
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "xla_spawn/replica/xm.h"

namespace {

double median_fork_ms(int forks) {
  std::vector<double> ms;
  for (int i = 0; i < forks; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(0);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 64;
  int forks = 20;
  bool usage = (argc - 1) % 2 != 0;
  for (int i = 1; i + 1 < argc && !usage; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--mib") {
      mib = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (flag == "--forks") {
      forks = std::atoi(argv[i + 1]);
    } else {
      usage = true;
    }
  }
  if (usage || mib == 0 || forks < 1) {
    std::fprintf(stderr, "usage: fork_cost [--mib M >= 1] [--forks K >= 1]\n");
    return 2;
  }
  xs::xm::init();
  xs::Communicator& comm = xs::xm::communicator();
  const size_t n = mib << 18;  // floats
  std::vector<float> buffer(n, 1.0f);
  const double unregistered = median_fork_ms(forks);
  if (!comm.register_buffer(buffer.data(), n * sizeof(float))) {
    std::fprintf(stderr, "fork_cost: %zu MiB could not be registered (is XLA_SPAWN_ARENA_BYTES large enough?)\n", mib);
    return 1;
  }
  comm.all_reduce(buffer.data(), n, xs::DType::kF32, xs::ReduceOp::kSum);
  const double registered = median_fork_ms(forks);
  comm.deregister_buffer(buffer.data());
  xs::xm::master_print("fork with {} MiB registered: {:.2f} ms; unregistered: {:.2f} ms (medians of {})",
                       mib, registered, unregistered, forks);
  comm.barrier();
  return 0;
}
