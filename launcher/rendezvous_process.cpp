#include "xla_spawn/launcher/rendezvous_process.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/launcher/exit_report.h"
#include "xla_spawn/launcher/helper_process.h"

namespace xs {

RendezvousProcess::RendezvousProcess(cluster::Fd listener, const cluster::JobToken& token,
                                     const cluster::ServerConfig& config)
    : wait_ms_(static_cast<int>(config.linger.count()) + 5000) {
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw IoError(errno_message("fork (rendezvous server)", errno));
  if (pid_ > 0) return;  // the listener closes here with `listener`; the child has its copy
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl took effect
  // stderr stays: the server's refusals and lost nodes are the master's console lines.
  const int fd = isolate_helper_process("xla-spawn-rdzv", listener.release());
  int code = 1;
  try {
    code = cluster::RendezvousServer(cluster::Fd(fd), token, config).run();
  } catch (const std::exception& e) {
    const std::string line = fmt::format("xla-spawn rendezvous: {}\n", e.what());
    (void)!::write(2, line.data(), line.size());
  }
  ::_exit(code);
}

std::optional<std::string> RendezvousProcess::gone(std::chrono::milliseconds wait) const {
  if (pid_ <= 0) return std::nullopt;
  siginfo_t info{};
  const auto look = [&] {
    info = {};
    return ::waitid(P_PID, static_cast<id_t>(pid_), &info,
                    WEXITED | WSTOPPED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid != 0;
  };
  if (!look()) {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd < 0) return std::nullopt;
    pollfd p{pidfd, POLLIN, 0};
    while (::poll(&p, 1, static_cast<int>(wait.count())) < 0 && errno == EINTR) {
    }
    ::close(pidfd);
    if (!look()) return std::nullopt;
  }
  switch (info.si_code) {
    case CLD_EXITED: return fmt::format("exited with code {}", info.si_status);
    case CLD_KILLED:
    case CLD_DUMPED:
      return fmt::format("was killed by signal {} ({})", info.si_status, signal_name(info.si_status));
    case CLD_STOPPED: return fmt::format("is stopped by {}", signal_name(info.si_status));
    default: return std::nullopt;
  }
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
