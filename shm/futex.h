#pragma once
// Thin wrappers over the Linux futex system call on 32-bit words that live in shared
// memory (process-shared: never FUTEX_PRIVATE_FLAG), plus a liveness probe for peer pids.
//
//   xs::futex_wait(&word, seen, 50'000'000);  // returns on wake, value change or timeout
//   word.store(seen + 1); xs::futex_wake_all(&word);

#include <sys/types.h>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

namespace xs {

// Sleeps while *word == expected, at most timeout_ns. Spurious returns are allowed: callers
// re-check their condition. True when a signal handler ran during the sleep (EINTR).
bool futex_wait(const std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns);

// Wakes every process sleeping on word.
void futex_wake_all(const std::atomic<uint32_t>* word);

// The fields of /proc/<pid>/stat after the command name (state first), or nullopt when it
// cannot be read (errno says why).
std::optional<std::string> process_stat_fields(pid_t pid);

// False when pid no longer exists or is a zombie (exited, not yet reaped by its parent).
bool process_alive(pid_t pid);

// When pid started, in clock ticks after boot (/proc/<pid>/stat, field 22), or nullopt when
// that cannot be read. A pid and its start time name one process; a pid alone may be reused.
std::optional<uint64_t> process_start_ticks(pid_t pid);

}  // namespace xs
