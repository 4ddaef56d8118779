#pragma once
// The project's exception types. Every error carries a message that names the values
// involved (ordinals, sizes, variables, paths), so it can be read without a debugger.
//
//   throw xs::InvalidArgument(fmt::format("--nprocs {}: expected 1..{}", n, kMax));
//   catch (const xs::Timeout& e) { ... }

#include <stdexcept>
#include <string>

namespace xs {

// Base of every error the project throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad user input: a flag, an environment variable, a file's contents, an API argument.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// The operating system or a file refused: open, mmap, fork, write, fsync.
class IoError : public Error {
 public:
  using Error::Error;
};

// Another replica died, poisoned the segment, or disagreed about a collective.
class PeerFailure : public Error {
 public:
  using Error::Error;
};

// A wait passed its deadline.
class Timeout : public Error {
 public:
  using Error::Error;
};

// A wait given up at the request of a signal handler (Ctrl-C in a Python replica).
class Interrupted : public Error {
 public:
  using Error::Error;
};

// A broken invariant inside the project: a bug, never the user's fault.
class InternalError : public Error {
 public:
  using Error::Error;
};

// Formats errno into "what: strerror (errno N)" for IoError messages.
std::string errno_message(const std::string& what, int errno_value);

}  // namespace xs
