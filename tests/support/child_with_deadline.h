#pragma once
// Runs a call that might hang for ever in a forked child, so a test fails instead of stalling
// CTest: the child runs `body` and _exits with its return value (alarm() bounds it too); the
// parent waits at most `deadline`, then SIGKILLs it.
//
//   const xs::testing::ChildOutcome r = xs::testing::run_in_child([] { load(); return 0; });
//   ASSERT_FALSE(r.hung);  EXPECT_EQ(r.exit_code, 0);

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>

namespace xs::testing {

struct ChildOutcome {
  bool hung = false;   // still running at the deadline (then killed)
  int exit_code = -1;  // -1 when it did not exit normally
};

inline ChildOutcome run_in_child(const std::function<int()>& body,
                                 std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(static_cast<unsigned>(deadline.count() / 1000 * 2 + 1));
    int code = 2;
    try {
      code = body();
    } catch (...) {
      code = 2;
    }
    ::_exit(code);
  }
  ChildOutcome outcome;
  int status = 0;
  pid_t done = 0;
  const auto end = std::chrono::steady_clock::now() + deadline;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    outcome.hung = true;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return outcome;
  }
  if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
  return outcome;
}

}  // namespace xs::testing
