#include "launcher/spawn.h"

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <iostream>

namespace xs {
namespace {

// The child's whole life after the supervisor's setup: run fn, flush, _exit.
[[noreturn]] void run_child(const std::function<void(int)>& fn, int ordinal) {
  int code = 0;
  try {
    fn(ordinal);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spawn: ordinal %d threw: %s\n", ordinal, e.what());
    code = 1;
  } catch (...) {
    std::fprintf(stderr, "spawn: ordinal %d threw a non-std::exception\n", ordinal);
    code = 1;
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(code);
}

}  // namespace

JobResult spawn(const std::function<void(int ordinal)>& fn, int nprocs,
                const SpawnOptions& options) {
  return supervise(
      nprocs, [&fn](int ordinal) { run_child(fn, ordinal); }, options);
}

}  // namespace xs
