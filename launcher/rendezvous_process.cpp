#include "launcher/rendezvous_process.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include <fmt/format.h>

#include "base/error.h"

namespace xs {
namespace {

// Keeps stderr (its refusals and lost nodes are the master's console lines) and the
// listener; everything else of the launcher's is closed, stdin/stdout become /dev/null.
int isolate(int listener_fd) {
  for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::signal(signo, SIG_IGN);
  ::prctl(PR_SET_NAME, "xla-spawn-rdzv");
  if (::dup2(listener_fd, 3) < 0) ::_exit(1);
  ::syscall(SYS_close_range, 4u, ~0u, 0u);
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd >= 0) {
    ::dup2(null_fd, 0);
    ::dup2(null_fd, 1);
    if (null_fd > 3) ::close(null_fd);
  }
  return 3;
}

}  // namespace

RendezvousProcess::RendezvousProcess(cluster::Fd listener, const cluster::JobToken& token,
                                     const cluster::ServerConfig& config)
    : wait_ms_(static_cast<int>(config.linger.count()) + 5000) {
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw IoError(errno_message("fork (rendezvous server)", errno));
  if (pid_ > 0) return;  // the listener closes here with `listener`; the child has its copy
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl took effect
  const int fd = isolate(listener.release());
  int code = 1;
  try {
    code = cluster::RendezvousServer(cluster::Fd(fd), token, config).run();
  } catch (const std::exception& e) {
    const std::string line = fmt::format("xla-spawn rendezvous: {}\n", e.what());
    (void)!::write(2, line.data(), line.size());
  }
  ::_exit(code);
}

RendezvousProcess::~RendezvousProcess() {
  if (pid_ <= 0) return;
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    while (::poll(&p, 1, wait_ms_) < 0 && errno == EINTR) {
    }
    ::close(pidfd);
  }
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
  }
}

}  // namespace xs
