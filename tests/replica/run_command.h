#pragma once
// Runs a shell command (a built binary, usually under xla-spawn) with a deadline and returns
// its exit code and combined stdout+stderr, for tests that need real processes.
//
//   CommandResult r = run_command(XLA_SPAWN " -n 4 -- " TRAIN_FMNIST " --max-steps 3");
//   EXPECT_EQ(r.exit_code, 0) << r.output;

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "tests/support/deadline_scale.h"

namespace xs::testing {

struct CommandResult {
  int exit_code = -1;  // the command's status, 124 when the deadline stopped it
  std::string output;
};

// `timeout_s` is enforced by coreutils timeout(1) (SIGTERM, then SIGKILL 10 s later), so a
// hung job cannot hang the test.
inline CommandResult run_command(const std::string& command, int timeout_s = 180) {
  const std::string full =
      "timeout -k 10 " + std::to_string(timeout_s * xs::testing::deadline_scale()) + " sh -c '" +
      command + "' 2>&1";
  FILE* pipe = ::popen(full.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed: " + full);
  CommandResult result;
  std::array<char, 4096> chunk;
  size_t n;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), pipe)) > 0)
    result.output.append(chunk.data(), n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// Occurrences of `needle` in `haystack`.
inline int count_of(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + 1))
    ++n;
  return n;
}

}  // namespace xs::testing
