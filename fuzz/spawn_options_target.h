#pragma once
// The fuzz target for xla-spawn's command line (launcher/options.h), shared by the libFuzzer
// entry point (fuzz/spawn_options_fuzz.cpp, built by fuzz/run) and the CTest corpus replay
// (tests/fuzz/cli_corpus_test.cpp). The input is argv after the program name, one argument
// per NUL-separated piece. Parsing must either succeed with values inside their documented
// ranges or throw xs::UsageError; anything else escaping, or a crash, is a bug.
//
//   bool accepted = xs::fuzz::spawn_options_one_input(data, size);  // throws only on a bug

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "xla_spawn/launcher/options.h"
#include "xla_spawn/replica/context.h"

namespace xs::fuzz {

// Splits at NUL bytes; at most `max_pieces` pieces (the rest is dropped), so an input of
// many NULs cannot make one iteration slow. An empty input is no pieces (xla-spawn alone).
inline std::vector<std::string> split_at_nul(const uint8_t* data, size_t size, size_t max_pieces) {
  if (size == 0) return {};
  std::vector<std::string> pieces(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] != 0) {
      pieces.back().push_back(static_cast<char>(data[i]));
    } else if (pieces.size() == max_pieces) {
      break;
    } else {
      pieces.emplace_back();
    }
  }
  return pieces;
}

inline void require(bool ok, const char* what) {
  if (!ok) throw std::logic_error(what);
}

// What an accepted command line promises (launcher/options.h, launcher/supervisor.h).
inline void check_accepted(const CommandLine& cl, const std::vector<std::string>& args) {
  if (cl.help) return;
  require(cl.nprocs >= 1 && cl.nprocs <= kMaxLocalWorldSize, "options: nprocs out of [1, 1024]");
  require(!cl.command.empty(), "options: accepted without a command");
  require(cl.command.size() <= args.size(), "options: command longer than argv");
  for (size_t i = 0; i < cl.command.size(); ++i) {
    require(cl.command[i] == args[args.size() - cl.command.size() + i],
            "options: the command is not argv's tail");
  }
  const SupervisorOptions& s = cl.supervisor;
  require(s.max_restarts >= 0 && s.max_restarts <= 1000, "options: max_restarts out of range");
  require(s.grace.count() >= 0 && s.timeout.count() >= 0, "options: negative duration");
  require(s.output.shown.empty() || s.output.shown.size() == static_cast<size_t>(cl.nprocs),
          "options: --show-ordinals set sized unlike the world");
}

inline bool spawn_options_one_input(const uint8_t* data, size_t size) {
  const std::vector<std::string> args = split_at_nul(data, size, 64);
  std::vector<const char*> argv = {"xla-spawn"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  CommandLine cl;
  try {
    cl = parse_command_line(static_cast<int>(argv.size()), argv.data());
  } catch (const UsageError&) {
    return false;  // rejected with a message: what most inputs get
  }
  check_accepted(cl, args);
  return true;
}

}  // namespace xs::fuzz
