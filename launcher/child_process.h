#pragma once
// Forks one replica: its own process group, death with the parent (PR_SET_PDEATHSIG, with
// the fork/prctl race closed), default signal dispositions, stdout/stderr onto the given
// pipes, stdin from /dev/null, optional core pinning, its environment; then runs `body`.
//
//   xs::ChildSetup setup{.ordinal = 2, .parent_pid = getpid(), .stdout_fd = w1, ...};
//   pid_t pid = xs::fork_replica(setup, [&](int ordinal) { execv(path, argv); _exit(127); });

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "xla_spawn/launcher/replica_env.h"

namespace xs {

struct ChildSetup {
  int ordinal = 0;
  pid_t parent_pid = 0;  // getpid() of the supervisor, captured before fork
  int stdout_fd = -1;    // pipe write ends that become the child's fd 1 and 2
  int stderr_fd = -1;
  std::vector<int> close_fds;  // the supervisor's other fds: other replicas' pipes, signal pipe
  std::optional<int> cpu;      // pin to this CPU (--bind-cores)
  std::vector<EnvVar> env;
};

// Runs in the child after the setup; must not return (exec, or run and _exit). If it
// does return, the child _exits 0.
using ReplicaBody = std::function<void(int ordinal)>;

// Forks, sets the child up and runs `body` there; in the parent returns the child's pid
// (already the leader of its own process group). Throws xs::IoError if fork fails.
// Call with stdio flushed (the supervisor does), or buffered output is written twice.
pid_t fork_replica(const ChildSetup& setup, const ReplicaBody& body);

// A replica that is a program (the CLI's command): `path` resolved, argv[0] included.
struct ExecCommand {
  std::string path;
  std::vector<std::string> argv;
};

// The same set-up, then execve(command): from a child that shares this process's memory
// until the exec (clone with CLONE_VM | CLONE_VFORK, as posix_spawn does), which spares
// fork's copy of the page tables, about a millisecond a replica here. The child allocates
// nothing and calls only async-signal-safe functions (its environment is built here); a
// failed exec prints "xla-spawn: cannot execute PATH: REASON" and exits 127.
pid_t spawn_replica(const ChildSetup& setup, const ExecCommand& command);

}  // namespace xs
