#include "xla_spawn/launcher/exit_report.h"

#include <sys/wait.h>

#include <cstring>

#include <fmt/format.h>

namespace xs {

bool is_failure(int wait_status) {
  return !(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0);
}

int exit_code_for_status(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return kExitLauncherError;  // stopped/continued statuses are not requested from waitpid
}

std::string signal_name(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", signo);
}

std::string describe_status(int wait_status) {
  if (WIFEXITED(wait_status)) return fmt::format("exited with code {}", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int signo = WTERMSIG(wait_status);
    const char* text = ::strsignal(signo);
    return fmt::format("killed by signal {} ({}: {}){}", signo, signal_name(signo),
                       text != nullptr ? text : "?", WCOREDUMP(wait_status) ? ", core dumped" : "");
  }
  return fmt::format("ended with wait status {:#x}", wait_status);
}

}  // namespace xs
