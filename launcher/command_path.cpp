#include "xla_spawn/launcher/command_path.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"

namespace xs {
namespace {

enum class FileCheck { kExecutable, kMissing, kDirectory, kNotExecutable };

FileCheck check_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return FileCheck::kMissing;
  if (S_ISDIR(st.st_mode)) return FileCheck::kDirectory;
  if (!S_ISREG(st.st_mode) || ::access(path.c_str(), X_OK) != 0) return FileCheck::kNotExecutable;
  return FileCheck::kExecutable;
}

[[noreturn]] void reject(const std::string& name, FileCheck check) {
  switch (check) {
    case FileCheck::kMissing:
      throw CommandNotFound(fmt::format("command not found: {}", name));
    case FileCheck::kDirectory:
      throw CommandNotFound(fmt::format("command is a directory: {}", name));
    case FileCheck::kNotExecutable:
      throw CommandNotFound(fmt::format("command is not executable: {}", name));
    case FileCheck::kExecutable:
      break;
  }
  throw CommandNotFound(fmt::format("command cannot be run: {}", name));
}

// A script's interpreter ("#!/usr/bin/python3 -u") must exist and be executable: else every
// replica would fail to start with ENOENT, which names the script. Unreadable files (execute
// permission only) and binaries are left to the kernel.
void check_interpreter(const std::string& name, const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return;
  char head[256];
  const ssize_t n = ::read(fd, head, sizeof head);
  ::close(fd);
  if (n < 2 || head[0] != '#' || head[1] != '!') return;
  const std::string_view line(head + 2, static_cast<size_t>(n) - 2);
  const size_t begin = line.find_first_not_of(" \t");
  // "#!" alone: the kernel refuses it (ENOEXEC) and /bin/sh runs the file, as in a shell.
  if (begin == std::string_view::npos || line[begin] == '\n') return;
  const size_t end = line.find_first_of(" \t\n", begin);
  if (end == std::string_view::npos) return;  // longer than we read: the kernel judges it
  const std::string interpreter(line.substr(begin, end - begin));
  const FileCheck check = check_file(interpreter);
  if (check == FileCheck::kExecutable) return;
  throw CommandNotFound(fmt::format(
      "{}: bad interpreter {}: {}", name, interpreter,
      check == FileCheck::kMissing     ? "no such file"
      : check == FileCheck::kDirectory ? "a directory"
                                       : "not executable"));
}

}  // namespace

std::string resolve_command(const std::string& name) {
  if (name.empty()) throw CommandNotFound("command not found: '' (empty command name)");
  if (name.find('/') != std::string::npos) {
    const FileCheck check = check_file(name);
    if (check != FileCheck::kExecutable) reject(name, check);
    check_interpreter(name, name);
    return name;
  }
  // Set but empty is one empty entry, the current directory, as for a shell and execvp.
  const char* set = std::getenv("PATH");
  const std::string path = set != nullptr ? set : "/usr/local/bin:/usr/bin:/bin";
  // A shell reports "permission denied" when the only match is not executable, so remember
  // the best failure seen rather than always saying "not found".
  std::optional<FileCheck> worst_match;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t colon = std::min(path.find(':', start), path.size());
    // An empty PATH entry means the current directory.
    const std::string_view dir =
        colon > start ? std::string_view(path).substr(start, colon - start) : ".";
    const std::string candidate = fmt::format("{}/{}", dir, name);
    const FileCheck check = check_file(candidate);
    if (check == FileCheck::kExecutable) {
      check_interpreter(name, candidate);
      return candidate;
    }
    if (check != FileCheck::kMissing && !worst_match) worst_match = check;
    start = colon + 1;
  }
  reject(name, worst_match.value_or(FileCheck::kMissing));
}

}  // namespace xs
