#include "xla_spawn/launcher/child_process.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "xla_spawn/base/error.h"

namespace xs {
namespace {

// Writes "<head><what>: <errno text>" to fd 2 without allocating, then exits with `code`
// (127: could not be run; 126, as a shell: found but not executable).
[[noreturn]] void child_fail(const char* what, const char* head = "xla-spawn child: ",
                             int code = 127) {
  const int saved = errno;
  const char* reason = ::strerror(saved);
  [[maybe_unused]] ssize_t n = ::write(2, head, std::strlen(head));
  n = ::write(2, what, std::strlen(what));
  n = ::write(2, ": ", 2);
  n = ::write(2, reason, std::strlen(reason));
  n = ::write(2, "\n", 1);
  ::_exit(code);
}

// Whether `path` starts like a binary (a NUL byte in its first line, as a shell judges it):
// such a file the kernel cannot run is no script for /bin/sh. Allocation-free.
bool looks_binary(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  char head[128];
  const ssize_t n = ::read(fd, head, sizeof head);
  ::close(fd);
  for (ssize_t i = 0; i < n && head[i] != '\n'; ++i) {
    if (head[i] == '\0') return true;
  }
  return false;
}

// Everything the launcher changed (handlers, ignored SIGPIPE, blocked signals) goes back to
// the defaults a freshly started program expects; SIG_IGN would survive exec otherwise.
void reset_signals() {
  for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT, SIGUSR1, SIGUSR2, SIGTSTP}) {
    ::signal(signo, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

void die_with_parent(pid_t parent_pid) {
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_fail("prctl(PR_SET_PDEATHSIG)");
  // The race: the parent may have died between fork and prctl, in which case no signal will
  // ever come; we were reparented, so getppid() no longer matches. kill(getpid()), not
  // raise(): in spawn_replica's child raise() would name the parent's thread.
  if (::getppid() != parent_pid) ::kill(::getpid(), SIGKILL);
}

void redirect_stdio(const ChildSetup& setup) {
  // The supervisor's fds go first: near the fd limit, opening /dev/null needs the room.
  for (int fd : setup.close_fds) {
    if (fd > 2) ::close(fd);
  }
  if (::dup2(setup.stdout_fd, 1) < 0 || ::dup2(setup.stderr_fd, 2) < 0) child_fail("dup2");
  if (setup.stdout_fd > 2) ::close(setup.stdout_fd);
  if (setup.stderr_fd > 2) ::close(setup.stderr_fd);
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0 || ::dup2(null_fd, 0) < 0) child_fail("stdin from /dev/null");
  if (null_fd != 0) ::close(null_fd);
}

void apply_env(const std::vector<EnvVar>& env) {
  for (const EnvVar& var : env) {
    const int rc = var.value ? ::setenv(var.name.c_str(), var.value->c_str(), 1)
                             : ::unsetenv(var.name.c_str());
    if (rc != 0) child_fail("setenv");
  }
}

void pin_to_cpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof set, &set) != 0) child_fail("sched_setaffinity");
}

// Everything a replica's child does before its program, in either way of starting it: its
// own group, death with the parent, default signals (unblocked), its stdio, its core.
// Async-signal-safe and allocation-free, as spawn_replica's child needs.
void set_up_child(const ChildSetup& setup) {
  ::setpgid(0, 0);
  die_with_parent(setup.parent_pid);
  reset_signals();
  redirect_stdio(setup);
  if (setup.cpu) pin_to_cpu(*setup.cpu);
}

// The environment a replica starts with: this process's, with `overrides` set or removed in
// order (a later one of the same name wins, as successive setenv calls would).
std::vector<std::string> child_environment(const std::vector<EnvVar>& overrides) {
  std::vector<std::string> env;
  for (char** var = environ; *var != nullptr; ++var) env.emplace_back(*var);
  for (const EnvVar& o : overrides) {
    std::erase_if(env, [&](const std::string& entry) {
      return entry.size() > o.name.size() && entry[o.name.size()] == '=' &&
             entry.compare(0, o.name.size(), o.name) == 0;
    });
    if (o.value) env.push_back(o.name + "=" + *o.value);
  }
  return env;
}

struct SpawnArgs {
  const ChildSetup* setup;
  const char* path;
  char* const* argv;
  char* const* envp;
  char* const* sh_argv;  // "/bin/sh", path, argv[1...]
};

// spawn_replica's child: the parent is suspended until this execs or exits.
int exec_child(void* arg) {
  const SpawnArgs& a = *static_cast<const SpawnArgs*>(arg);
  set_up_child(*a.setup);  // also unblocks what spawn_replica blocked
  ::execve(a.path, a.argv, a.envp);
  // An executable text file without "#!": run by /bin/sh, as a shell and execvp do. A binary
  // for another machine is said to be one.
  if (errno == ENOEXEC) {
    if (looks_binary(a.path)) {
      errno = ENOEXEC;
      child_fail(a.path, "xla-spawn: cannot execute binary file ", 126);
    }
    ::execve(a.sh_argv[0], a.sh_argv, a.envp);
  }
  child_fail(a.path, "xla-spawn: cannot execute ");
}

}  // namespace

pid_t spawn_replica(const ChildSetup& setup, const ExecCommand& command) {
  const std::vector<std::string> env = child_environment(setup.env);
  std::vector<char*> envp;
  for (const std::string& var : env) envp.push_back(const_cast<char*>(var.c_str()));
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (const std::string& arg : command.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::string sh = "/bin/sh";
  std::vector<char*> sh_argv = {sh.data(), const_cast<char*>(command.path.c_str())};
  sh_argv.insert(sh_argv.end(), argv.begin() + 1, argv.end());  // the arguments, then nullptr
  const SpawnArgs args{&setup, command.path.c_str(), argv.data(), envp.data(), sh_argv.data()};
  // The child runs on a stack of its own; no handler of ours may run in it before it has
  // reset them, so every signal stays blocked across the clone (the child unblocks them).
  std::vector<std::byte> stack(size_t{64} << 10);
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer keeps its view of the process (the handlers the program installed, among
  // others) in the address space: a child sharing it would rewrite the launcher's, and its
  // reset to SIG_DFL made the instrumented launcher drop SIGINT. So that build forks.
  const pid_t pid = ::fork();
  if (pid == 0) exec_child(const_cast<SpawnArgs*>(&args));
#else
  const pid_t pid = ::clone(exec_child, stack.data() + stack.size(),
                            CLONE_VM | CLONE_VFORK | SIGCHLD, const_cast<SpawnArgs*>(&args));
#endif
  const int clone_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) {
    throw IoError(errno_message("clone of replica " + std::to_string(setup.ordinal), clone_errno));
  }
  ::setpgid(pid, pid);  // done by the child already (the parent waited for its exec)
  return pid;
}

pid_t fork_replica(const ChildSetup& setup, const ReplicaBody& body) {
  // As for spawn_replica: no handler of ours may run in the child before it has reset them.
  // The SignalPipe's would write a stop signal meant for the child into the supervisor's own
  // pipe, where it read as an interrupt of the job, and the child would not stop.
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t pid = ::fork();
  const int fork_errno = errno;
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) {
    throw IoError(errno_message("fork of replica " + std::to_string(setup.ordinal), fork_errno));
  }
  if (pid > 0) {
    // Also done by the child; whichever runs first wins, so the group exists before the
    // parent can signal it. EACCES (child already exec'd) and ESRCH are harmless here.
    ::setpgid(pid, pid);
    return pid;
  }
  set_up_child(setup);
  apply_env(setup.env);
  body(setup.ordinal);
  ::_exit(0);
}

}  // namespace xs
