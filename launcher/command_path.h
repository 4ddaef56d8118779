#pragma once
// Finds the program xla-spawn will run, the way a shell does, before anything is forked, so
// a typo fails once with a clear message instead of N times in N children.
//
//   std::string path = xs::resolve_command("train");   // "/usr/local/bin/train"

#include <string>

#include "xla_spawn/base/error.h"

namespace xs {

// The command is missing or cannot be executed; xla-spawn exits 127 like a shell.
class CommandNotFound : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// A name containing '/' is used as is; otherwise each PATH entry is tried in order
// (PATH unset: "/usr/local/bin:/usr/bin:/bin"). Returns the path of a regular, executable
// file; throws CommandNotFound saying which name and why (not found, a directory, not
// executable, a script whose "#!" interpreter is missing or not executable). A text file
// without "#!" is run by /bin/sh when started, as a shell does.
std::string resolve_command(const std::string& name);

}  // namespace xs
