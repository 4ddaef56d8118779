#include "xla_spawn/launcher/oom_watch.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace xs {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::optional<uint64_t> read_count(const std::string& path) {
  if (path.empty()) return std::nullopt;
  return parse_oom_kills(read_text(path));
}

}  // namespace

std::optional<uint64_t> parse_oom_kills(const std::string& text) {
  std::istringstream lines(text);
  std::string key;
  uint64_t value = 0;
  while (lines >> key >> value) {
    if (key == "oom_kill") return value;
  }
  return std::nullopt;
}

std::string memory_events_file(const std::string& proc_self_cgroup, const std::string& root) {
  std::istringstream lines(proc_self_cgroup);
  std::vector<std::string> candidates;
  for (std::string line; std::getline(lines, line);) {
    const size_t first = line.find(':');
    const size_t second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (path.find("..") != std::string::npos) continue;
    if (controllers.empty()) {  // cgroup v2 (unified, or mounted at root/unified in hybrid)
      candidates.push_back(root + path + "/memory.events");
      candidates.push_back(root + "/unified" + path + "/memory.events");
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      candidates.insert(candidates.begin(), root + "/memory" + path + "/memory.oom_control");
    }
  }
  for (std::string& file : candidates) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(file, ec) && read_count(file)) {
      return std::filesystem::path(file).lexically_normal().string();
    }
  }
  return {};
}

namespace {

// The kernel log's records (/dev/kmsg), or nullopt when it cannot be read. Bounded: the ring
// buffer holds at most a few MiB.
std::optional<std::string> read_kernel_log() {
  const int fd = ::open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string log;
  char record[8192];
  for (int i = 0; i < 200'000 && log.size() < (size_t{16} << 20); ++i) {
    const ssize_t n = ::read(fd, record, sizeof record);
    if (n > 0) {
      log.append(record, static_cast<size_t>(n));
    } else if (n < 0 && errno == EPIPE) {
      continue;  // records overwritten while reading: go on with the next
    } else {
      break;  // EAGAIN: the end
    }
  }
  ::close(fd);
  return log;
}

}  // namespace

std::optional<std::string> oom_kill_line(const std::string& log, pid_t pid) {
  const std::string needle = fmt::format("Killed process {} (", pid);
  const size_t at = log.rfind(needle);
  if (at == std::string::npos) return std::nullopt;
  const size_t close = log.find(')', at + needle.size());
  const size_t end = log.find('\n', at);
  if (close == std::string::npos || (end != std::string::npos && close > end)) {
    return std::nullopt;
  }
  return log.substr(at, close + 1 - at);
}

std::string own_memory_events_file() {
  return memory_events_file(read_text("/proc/self/cgroup"), "/sys/fs/cgroup");
}

OomWatch::OomWatch()
    : cgroup_file_(own_memory_events_file()),
      cgroup_kills_(read_count(cgroup_file_)) {}

std::optional<std::string> OomWatch::explain_sigkill(pid_t pid) const {
  if (const std::optional<std::string> log = read_kernel_log()) {
    if (const std::optional<std::string> line = oom_kill_line(*log, pid)) {
      return fmt::format("the kernel's OOM killer (kernel log: {})", *line);
    }
    return std::nullopt;  // the log would name it
  }
  if (cgroup_kills_) {
    if (const auto now = read_count(cgroup_file_); now && *now > *cgroup_kills_) {
      return fmt::format("the kernel's OOM killer, by its memory cgroup's count (oom_kill in {} "
                         "rose from {} to {} while it ran; the kernel log, which would name the "
                         "process, is not readable)",
                         cgroup_file_, *cgroup_kills_, *now);
    }
  }
  return std::nullopt;
}

}  // namespace xs
