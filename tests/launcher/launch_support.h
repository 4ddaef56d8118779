#pragma once
// Test support for the launcher tests: run xla-spawn (or any program) as a real child with
// stdout/stderr captured to files, wait for it with a deadline, and check on replicas by pid.
//
//   xs::testing::TempDir dir;
//   xs::testing::Launch run({"-n", "4", "--", helper_path(), "--do", "exit:3"});
//   const int status = run.wait_or_fail(std::chrono::seconds(30));
//   EXPECT_EQ(WEXITSTATUS(status), 3) << run.err();

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace xs::testing {

using Clock = std::chrono::steady_clock;

// Paths of the built binaries (CMake passes them as compile definitions).
std::string xla_spawn_path();
std::string helper_path();

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A running process: `xla-spawn ARGS...` by default, or `argv` verbatim with raw = true.
class Launch {
 public:
  explicit Launch(const std::vector<std::string>& args, bool raw = false);
  ~Launch();  // SIGKILLs and reaps the process if it still runs
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;

  pid_t pid() const { return pid_; }
  // The wait status, or nullopt if it did not exit within `timeout`.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);
  // As wait_for, but a timeout fails the test (and kills the process).
  int wait_or_fail(std::chrono::milliseconds timeout);
  Clock::time_point exit_time() const { return exit_time_; }  // valid after a wait
  std::string out() const;
  std::string err() const;

 private:
  TempDir files_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool reaped_ = false;
  Clock::time_point exit_time_{};
};

struct RunResult {
  int exit_code = -1;  // WEXITSTATUS, or -1 if it did not exit normally
  std::string out;
  std::string err;
  double seconds = 0;
};

// Runs `xla-spawn ARGS...` to completion (at most `timeout`, else the test fails).
RunResult run_xla_spawn(const std::vector<std::string>& args,
                        std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Polls `condition` every 2 ms until it holds or `timeout` passes; returns whether it held.
bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

// Alive and not a zombie (an orphan's zombie may linger if PID 1 does not reap).
bool process_alive(pid_t pid);
// The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, 'Z', ...), or '\0' when gone.
char process_state(pid_t pid);

std::string read_file(const std::string& path);

// The pids the helpers wrote to DIR/pid.<k>, waiting (bounded) until all `n` exist.
std::vector<pid_t> wait_for_pids(const std::string& dir, int n, std::chrono::milliseconds timeout);

// Lines of `text` that start with `prefix`.
std::vector<std::string> lines_with(const std::string& text, const std::string& prefix);

}  // namespace xs::testing
