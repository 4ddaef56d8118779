#include "xla_spawn/launcher/orphans.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "xla_spawn/base/error.h"
#include "xla_spawn/shm/futex.h"

namespace xs {
namespace {

// The children of this process, zombies included (they still need reaping): from each of its
// threads' /proc/self/task/<tid>/children, else (a kernel without CONFIG_PROC_CHILDREN) from
// every process's /proc/<pid>/stat, whose parent pid follows the state.
std::vector<pid_t> children_of_this_process() {
  std::vector<pid_t> children;
  std::error_code ec;
  bool listed = false;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    FILE* file = std::fopen((task.path() / "children").c_str(), "re");
    if (file == nullptr) continue;
    listed = true;
    long pid = 0;
    while (std::fscanf(file, "%ld", &pid) == 1) children.push_back(static_cast<pid_t>(pid));
    std::fclose(file);
  }
  if (listed) return children;
  const pid_t self = ::getpid();
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    const std::optional<std::string> fields = process_stat_fields(pid);
    char state = 0;
    int ppid = 0;
    if (fields && std::sscanf(fields->c_str(), "%c %d", &state, &ppid) == 2 && ppid == self) {
      children.push_back(pid);
    }
  }
  return children;
}

}  // namespace

void become_subreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
    throw IoError(errno_message("prctl(PR_SET_CHILD_SUBREAPER)", errno));
  }
}

int kill_orphans(const std::set<pid_t>& keep) {
  constexpr int kRounds = 8;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int count = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<pid_t> orphans;
    for (pid_t pid : children_of_this_process()) {
      if (!keep.contains(pid)) orphans.push_back(pid);
    }
    if (orphans.empty()) break;
    for (pid_t pid : orphans) {
      if (::getpgid(pid) == pid) ::kill(-pid, SIGKILL);  // its group, not one it merely joined
      ::kill(pid, SIGKILL);
    }
    // SIGKILLed children exit promptly; one stuck in the kernel is left to init at the deadline.
    for (pid_t pid : orphans) {
      int status = 0;
      while (::waitpid(pid, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ++count;
    }
  }
  return count;
}

}  // namespace xs
