#pragma once
// How a job ended, in numbers (xla-spawn's exit status) and in words (the summary).
//
//   int code = xs::exit_code_for_status(wait_status);        // 3, or 128 + 9 for SIGKILL
//   std::string why = xs::describe_status(wait_status);      // "killed by signal 9 (SIGKILL:
//   Killed)"
//
// Exit codes of xla-spawn: 0 success; the root cause's exit code, or 128 + its signal;
// 124 job timeout (like coreutils timeout); 128 + S when stopped by signal S (Ctrl-C: 130);
// 2 usage error; 127 command not found or not executable; 1 launcher error (fork, log dir).

#include <string>

namespace xs {

inline constexpr int kExitLauncherError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitTimeout = 124;
inline constexpr int kExitCommandNotFound = 127;

enum class JobOutcome { kSucceeded, kFailed, kTimedOut, kInterrupted };

// A waitpid() status that counts as failure: non-zero exit or death by a signal.
bool is_failure(int wait_status);

// Exit code for a waitpid() status: the code, or 128 + signal.
int exit_code_for_status(int wait_status);

// "exited with code 3" or "killed by signal 11 (SIGSEGV: Segmentation fault)".
std::string describe_status(int wait_status);

// "SIGINT" (or "signal 64" when the name is unknown).
std::string signal_name(int signo);

}  // namespace xs
