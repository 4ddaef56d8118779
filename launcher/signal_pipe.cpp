#include "xla_spawn/launcher/signal_pipe.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"

namespace xs {
namespace {

// The handler's only state: the write end of the live SignalPipe (-1: none).
std::atomic<int> g_write_fd{-1};

extern "C" void on_signal(int signo) {
  const int saved_errno = errno;
  const int fd = g_write_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const char byte = static_cast<char>(signo);
    // Non-blocking: if 64 KiB of signals are already pending, dropping more loses nothing.
    [[maybe_unused]] const ssize_t n = ::write(fd, &byte, 1);
  }
  errno = saved_errno;
}

}  // namespace

void install_unless_nohup(int signo, const struct sigaction& action, struct sigaction* previous) {
  ::sigaction(signo, nullptr, previous);
  if (signo == SIGHUP && previous->sa_handler == SIG_IGN) return;
  ::sigaction(signo, &action, nullptr);
}

SignalPipe::SignalPipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw IoError(errno_message("signal pipe", errno));
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  int expected = -1;
  if (!g_write_fd.compare_exchange_strong(expected, write_fd_)) {
    ::close(read_fd_);
    ::close(write_fd_);
    XS_CHECK(false, "a supervisor is already running in this process (signal pipe fd {})",
             expected);
  }
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int i = 0; i < kCount; ++i) install_unless_nohup(kSignals[i], action, &previous_[i]);
  struct sigaction child_default {};
  child_default.sa_handler = SIG_DFL;
  sigemptyset(&child_default.sa_mask);
  ::sigaction(SIGCHLD, &child_default, &previous_child_);
}

SignalPipe::~SignalPipe() {
  for (int i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
  ::sigaction(SIGCHLD, &previous_child_, nullptr);
  g_write_fd.store(-1);
  ::close(read_fd_);
  ::close(write_fd_);
}

void SignalPipe::replay(int signo) {
  const char byte = static_cast<char>(signo);  // as the handler writes it
  [[maybe_unused]] const ssize_t n = ::write(write_fd_, &byte, 1);
}

std::vector<int> SignalPipe::drain() {
  std::vector<int> signals;
  char bytes[64];
  ssize_t n;
  while ((n = ::read(read_fd_, bytes, sizeof bytes)) > 0) {
    for (ssize_t i = 0; i < n; ++i) signals.push_back(static_cast<unsigned char>(bytes[i]));
  }
  return signals;
}

}  // namespace xs
