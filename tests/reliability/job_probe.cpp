#include "tests/reliability/job_probe.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "tests/launcher/launch_support.h"

namespace xs::testing {

std::string train_fmnist_path() {
  return XS_TRAIN_FMNIST_PATH;
}
std::string checkpoint_check_path() {
  return XS_CHECKPOINT_CHECK_PATH;
}
std::string corrupt_replica_path() {
  return XS_CORRUPT_REPLICA_PATH;
}

std::string unique_tag() {
  static std::atomic<int> counter{0};
  return "t" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

namespace {

std::vector<std::string> environment_of(const std::filesystem::path& proc_dir) {
  std::ifstream in(proc_dir / "environ", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> vars;
  for (size_t begin = 0; begin < all.size();) {
    const size_t end = all.find('\0', begin);
    vars.push_back(all.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return vars;
}

bool has(const std::vector<std::string>& vars, const std::string& entry) {
  for (const std::string& v : vars) {
    if (v == entry) return true;
  }
  return false;
}

template <class Visit>
void for_each_tagged(const std::string& tag, Visit visit) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    const std::vector<std::string> vars = environment_of(entry.path());
    if (has(vars, std::string(kTrialTagEnv) + "=" + tag) && process_alive(pid)) visit(pid, vars);
  }
}

}  // namespace

std::vector<pid_t> tagged_processes(const std::string& tag) {
  std::vector<pid_t> pids;
  for_each_tagged(tag, [&](pid_t pid, const auto&) { pids.push_back(pid); });
  return pids;
}

std::optional<pid_t> tagged_replica(const std::string& tag, int ordinal) {
  std::optional<pid_t> found;
  for_each_tagged(tag, [&](pid_t pid, const std::vector<std::string>& vars) {
    if (has(vars, "XLA_SPAWN_ORDINAL=" + std::to_string(ordinal))) found = pid;
  });
  return found;
}

std::vector<std::string> segments_of_launcher(pid_t launcher_pid) {
  const std::string prefix =
      "xla-spawn-" + std::to_string(::getuid()) + "-xs-" + std::to_string(launcher_pid) + "-";
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) found.push_back(name);
  }
  return found;
}

std::vector<std::string> train_command(const std::string& checkpoint, int steps) {
  // MLP, 16 per replica, 4096 samples, no evaluation: a step is milliseconds, and the
  // checkpoint (parameters + Adam state, ~8 MB) is big enough to be caught mid-write.
  return {"--",
          train_fmnist_path(),
          "--model",
          "mlp",
          "--batch-size",
          "16",
          "--epochs",
          steps > 0 ? "1" : "1000",
          "--max-steps",
          std::to_string(steps),
          "--train-samples",
          "4096",
          "--no-eval",
          "--seed",
          "7",
          "--checkpoint",
          checkpoint,
          "--checkpoint-every",
          "3",
          "--resume"};
}

std::string check_checkpoint(const std::string& path) {
  const std::string command = checkpoint_check_path() + " '" + path + "'";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  std::string out;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;
  ::pclose(pipe);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace xs::testing
