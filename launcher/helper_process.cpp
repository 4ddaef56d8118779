#include "xla_spawn/launcher/helper_process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <csignal>
#include <initializer_list>

namespace xs {

int isolate_helper_process(const char* name, int keep_fd) {
  for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1}) ::signal(signo, SIG_IGN);
  ::prctl(PR_SET_NAME, name);
  if (::dup2(keep_fd, 3) < 0) ::_exit(1);
  ::syscall(SYS_close_range, 4u, ~0u, 0u);
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd >= 0) {
    ::dup2(null_fd, 0);
    ::dup2(null_fd, 1);
    if (null_fd > 3) ::close(null_fd);
  }
  return 3;
}

}  // namespace xs
