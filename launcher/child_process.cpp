#include "launcher/child_process.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace xs {
namespace {

// Writes a fixed message and the errno text to fd 2 without allocating, then exits 127.
[[noreturn]] void child_fail(const char* what) {
  const int saved = errno;
  const char* reason = ::strerror(saved);
  [[maybe_unused]] ssize_t n = ::write(2, "xla-spawn child: ", 17);
  n = ::write(2, what, std::strlen(what));
  n = ::write(2, ": ", 2);
  n = ::write(2, reason, std::strlen(reason));
  n = ::write(2, "\n", 1);
  ::_exit(127);
}

// Everything the launcher changed (handlers, ignored SIGPIPE, blocked signals) goes back to
// the defaults a freshly started program expects; SIG_IGN would survive exec otherwise.
void reset_signals() {
  for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT, SIGUSR1, SIGUSR2}) {
    ::signal(signo, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

void die_with_parent(pid_t parent_pid) {
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_fail("prctl(PR_SET_PDEATHSIG)");
  // The race: the parent may have died between fork and prctl, in which case no signal will
  // ever come; we were reparented, so getppid() no longer matches.
  if (::getppid() != parent_pid) ::raise(SIGKILL);
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

}  // namespace

pid_t fork_replica(const ChildSetup& setup, const ReplicaBody& body) {
  const pid_t pid = ::fork();
  if (pid < 0) {
    throw IoError(errno_message("fork of replica " + std::to_string(setup.ordinal), errno));
  }
  if (pid > 0) {
    // Also done by the child; whichever runs first wins, so the group exists before the
    // parent can signal it. EACCES (child already exec'd) and ESRCH are harmless here.
    ::setpgid(pid, pid);
    return pid;
  }
  ::setpgid(0, 0);
  die_with_parent(setup.parent_pid);
  reset_signals();
  redirect_stdio(setup);
  if (setup.cpu) pin_to_cpu(*setup.cpu);
  apply_env(setup.env);
  body(setup.ordinal);
  ::_exit(0);
}

}  // namespace xs
