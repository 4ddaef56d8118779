// The floor for launching N processes: posix_spawn N copies of a program and wait for them
// all, nothing else (no pipes, no segment, no supervision). scripts/bench-launch times
// `xla-spawn -n N -- true` against `spawn_floor N true` side by side.
//
//   spawn_floor 8 /bin/true

#include <spawn.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

extern char** environ;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: spawn_floor N PROGRAM [ARGS...]\n");
    return 2;
  }
  const int n = std::atoi(argv[1]);
  if (n < 1 || n > 1024) {
    std::fprintf(stderr, "spawn_floor: N must be 1..1024\n");
    return 2;
  }
  std::vector<pid_t> pids(static_cast<size_t>(n));
  for (pid_t& pid : pids) {
    if (posix_spawnp(&pid, argv[2], nullptr, nullptr, argv + 2, environ) != 0) {
      std::perror("spawn_floor: posix_spawnp");
      return 1;
    }
  }
  int failures = 0;
  for (pid_t pid : pids) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}
