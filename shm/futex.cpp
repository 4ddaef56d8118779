#include "shm/futex.h"

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

void futex_wait(const std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  if (timeout_ns <= 0) return;
  timespec timeout{};
  timeout.tv_sec = static_cast<time_t>(timeout_ns / 1'000'000'000);
  timeout.tv_nsec = static_cast<long>(timeout_ns % 1'000'000'000);
  // EAGAIN (value changed), EINTR and ETIMEDOUT all mean "re-check": nothing to handle here.
  ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT, expected, &timeout,
            nullptr, 0);
}

void futex_wake_all(const std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
}

bool process_alive(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // kill() succeeds on a zombie; its state letter in /proc/<pid>/stat is Z (or X).
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* file = std::fopen(path, "re");
  if (file == nullptr) return errno != ENOENT;
  char buffer[512] = {};
  const size_t n = std::fread(buffer, 1, sizeof buffer - 1, file);
  std::fclose(file);
  buffer[n] = '\0';
  // The command name is in parentheses and may contain spaces: the state follows the last ')'.
  const char* close = std::strrchr(buffer, ')');
  if (close == nullptr || close[1] == '\0' || close[2] == '\0') return true;
  return close[2] != 'Z' && close[2] != 'X';
}

std::optional<uint64_t> process_start_ticks(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* file = std::fopen(path, "re");
  if (file == nullptr) return std::nullopt;
  char buffer[1024] = {};
  const size_t n = std::fread(buffer, 1, sizeof buffer - 1, file);
  std::fclose(file);
  buffer[n] = '\0';
  // Fields after the command name's last ')': state is field 3, starttime field 22.
  const char* p = std::strrchr(buffer, ')');
  if (p == nullptr) return std::nullopt;
  for (int field = 2; field < 22; ++field) {
    p = std::strchr(p + 1, ' ');
    if (p == nullptr) return std::nullopt;
  }
  char* end = nullptr;
  const unsigned long long ticks = std::strtoull(p + 1, &end, 10);
  if (end == p + 1) return std::nullopt;
  return static_cast<uint64_t>(ticks);
}

}  // namespace xs
