#include "xla_spawn/shm/futex.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace xs {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

bool futex_wait(const std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  if (timeout_ns <= 0) return false;
  timespec timeout{};
  timeout.tv_sec = static_cast<time_t>(timeout_ns / 1'000'000'000);
  timeout.tv_nsec = static_cast<long>(timeout_ns % 1'000'000'000);
  // EAGAIN (value changed), EINTR and ETIMEDOUT all mean "re-check"; EINTR also tells the
  // caller that a signal handler ran.
  return ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT, expected,
                   &timeout, nullptr, 0) != 0 &&
         errno == EINTR;
}

void futex_wake_all(const std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
}

std::optional<std::string> process_stat_fields(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* file = std::fopen(path, "re");
  if (file == nullptr) return std::nullopt;
  char buffer[1024] = {};
  const size_t n = std::fread(buffer, 1, sizeof buffer - 1, file);
  std::fclose(file);
  buffer[n] = '\0';
  // The command name is in parentheses and may contain spaces: the fields follow the last ')'.
  const char* close = std::strrchr(buffer, ')');
  if (close == nullptr || close[1] != ' ') return std::nullopt;
  return std::string(close + 2);
}

bool process_alive(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // kill() succeeds on a zombie; its state letter is Z (or X). Unreadable: gone only if absent.
  errno = 0;
  const std::optional<std::string> fields = process_stat_fields(pid);
  if (!fields) return errno != ENOENT;
  return fields->empty() || ((*fields)[0] != 'Z' && (*fields)[0] != 'X');
}

std::optional<uint64_t> process_start_ticks(pid_t pid) {
  const std::optional<std::string> fields = process_stat_fields(pid);
  if (!fields) return std::nullopt;
  // State is field 3, starttime field 22.
  const char* p = fields->c_str() - 1;
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p + 1, ' ');
    if (p == nullptr) return std::nullopt;
  }
  char* end = nullptr;
  const unsigned long long ticks = std::strtoull(p + 1, &end, 10);
  if (end == p + 1) return std::nullopt;
  return static_cast<uint64_t>(ticks);
}

}  // namespace xs
