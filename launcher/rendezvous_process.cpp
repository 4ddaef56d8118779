#include "xla_spawn/launcher/rendezvous_process.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/launcher/exit_report.h"
#include "xla_spawn/launcher/helper_process.h"

namespace xs {
namespace {

std::atomic<pid_t> g_status_target{0};  // read by signal handlers: lock-free
static_assert(std::atomic<pid_t>::is_always_lock_free);

// The server's SIGUSR1 as a readable fd: the signal blocked (and no longer ignored, as
// isolate_helper_process left it), a signalfd the server drains. -1 when that fails: the
// server then answers no SIGUSR1, which stays blocked and harmless.
int status_signal_fd() {
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  if (::sigprocmask(SIG_BLOCK, &usr1, nullptr) != 0) return -1;
  ::signal(SIGUSR1, SIG_DFL);
  return ::signalfd(-1, &usr1, SFD_NONBLOCK | SFD_CLOEXEC);
}

}  // namespace

pid_t RendezvousProcess::status_target() {
  return g_status_target.load();
}

RendezvousProcess::RendezvousProcess(cluster::Fd listener, const cluster::JobToken& token,
                                     const cluster::ServerConfig& config)
    : wait_ms_(static_cast<int>(config.linger.count()) + 5000) {
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw IoError(errno_message("fork (rendezvous server)", errno));
  if (pid_ > 0) {  // the listener closes here with `listener`; the child has its copy
    g_status_target.store(pid_);
    return;
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl took effect
  // stderr stays: the server's refusals and lost nodes are the master's console lines.
  const int fd = isolate_helper_process("xla-spawn-rdzv", listener.release());
  cluster::ServerConfig with_status = config;
  with_status.status_fd = status_signal_fd();
  int code = 1;
  try {
    code = cluster::RendezvousServer(cluster::Fd(fd), token, with_status).run();
  } catch (const std::exception& e) {
    const std::string line = fmt::format("xla-spawn rendezvous: {}\n", e.what());
    (void)!::write(2, line.data(), line.size());
  }
  ::_exit(code);
}

std::optional<RendezvousProcess::Fate> RendezvousProcess::gone(
    std::chrono::milliseconds wait) const {
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
  using Kind = Fate::Kind;
  switch (info.si_code) {
    case CLD_EXITED: return Fate{Kind::kExited, fmt::format("exited with code {}", info.si_status)};
    case CLD_KILLED:
    case CLD_DUMPED:
      return Fate{Kind::kKilled, fmt::format("was killed by signal {} ({})", info.si_status,
                                             signal_name(info.si_status))};
    case CLD_STOPPED:
      return Fate{Kind::kStopped, fmt::format("is stopped by {}", signal_name(info.si_status))};
    default: return std::nullopt;
  }
}

RendezvousProcess::~RendezvousProcess() {
  if (pid_ <= 0) return;
  g_status_target.store(0);
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
