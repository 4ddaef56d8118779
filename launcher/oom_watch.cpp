#include "launcher/oom_watch.h"

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

OomWatch::OomWatch()
    : cgroup_file_(memory_events_file(read_text("/proc/self/cgroup"), "/sys/fs/cgroup")),
      cgroup_kills_(read_count(cgroup_file_)),
      system_kills_(read_count("/proc/vmstat")) {}

std::optional<std::string> OomWatch::explain_sigkill() const {
  if (cgroup_kills_) {
    if (const auto now = read_count(cgroup_file_); now && *now > *cgroup_kills_) {
      return fmt::format("the kernel's OOM killer (oom_kill in {} rose from {} to {})",
                         cgroup_file_, *cgroup_kills_, *now);
    }
  }
  if (system_kills_) {
    if (const auto now = read_count("/proc/vmstat"); now && *now > *system_kills_) {
      return fmt::format("the kernel's OOM killer, most likely (/proc/vmstat oom_kill rose from "
                         "{} to {} during the attempt)",
                         *system_kills_, *now);
    }
  }
  return std::nullopt;
}

}  // namespace xs
