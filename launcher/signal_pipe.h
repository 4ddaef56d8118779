#pragma once
// Turns SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP (Ctrl-Z) and SIGUSR1 (the hang report) into
// bytes on a pipe while it lives, so the supervisor's poll() loop sees them like any other
// event (the self-pipe trick; async-signal-safe). A SIGHUP ignored when it is made stays
// ignored: the program was started under nohup, to outlive its terminal.
// Also puts SIGCHLD back to SIG_DFL meanwhile: with SIG_IGN the kernel would reap the
// replicas itself and their exit statuses would be lost.
//
//   xs::SignalPipe signals;                  // handlers installed
//   pollfd p{signals.read_fd(), POLLIN, 0};  ... for (int s : signals.drain()) forward(s);
//                                            // previous handlers restored on destruction

#include <csignal>
#include <vector>

namespace xs {

// Installs `action` for `signo` and saves the previous one in `previous`, except for a SIGHUP
// that is ignored: the program was started under nohup, to outlive its terminal.
void install_unless_nohup(int signo, const struct sigaction& action, struct sigaction* previous);

class SignalPipe {
 public:
  // Installs the handlers; throws xs::InternalError if another SignalPipe is alive (one
  // supervisor per process at a time), xs::IoError if the pipe cannot be made.
  SignalPipe();
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int read_fd() const { return read_fd_; }
  int write_fd() const { return write_fd_; }  // children close both ends

  // The signals delivered since the last call, in order (empty if none).
  std::vector<int> drain();
  // Queues `signo` as if it had been delivered again: the next drain() returns it.
  void replay(int signo);

  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGUSR1};
  static constexpr int kCount = 6;

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
  struct sigaction previous_[kCount] = {};
  struct sigaction previous_child_ = {};
};

}  // namespace xs
