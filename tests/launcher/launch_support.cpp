#include "tests/launcher/launch_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

namespace xs::testing {

std::string xla_spawn_path() {
  return XS_XLA_SPAWN_PATH;
}
std::string helper_path() {
  return XS_REPLICA_HELPER_PATH;
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/xs-launcher-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp " + pattern);
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Launch::Launch(const std::vector<std::string>& args, bool raw) {
  std::vector<std::string> argv = args;
  if (!raw) argv.insert(argv.begin(), xla_spawn_path());
  std::vector<char*> ptrs;
  for (std::string& a : argv) ptrs.push_back(a.data());
  ptrs.push_back(nullptr);
  const std::string out = files_ / "stdout";
  const std::string err = files_ / "stderr";
  std::fflush(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    const int out_fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out_fd < 0 || err_fd < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0) ::_exit(120);
    // As from an interactive shell, whatever the test runner ignores (nohup, a background job
    // of a script): the signal tests send these.
    for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::signal(signo, SIG_DFL);
    ::execv(ptrs[0], ptrs.data());
    ::_exit(121);
  }
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd_ < 0) throw std::runtime_error("pidfd_open failed");
}

Launch::~Launch() {
  if (!reaped_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  ::close(pidfd_);
}

std::optional<int> Launch::wait_for(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!reaped_) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{pidfd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (ready == 0) return std::nullopt;
    if (ready < 0) continue;  // EINTR
    exit_time_ = Clock::now();
    int status = 0;
    if (::waitpid(pid_, &status, 0) == pid_) {
      reaped_ = true;
      return status;
    }
  }
  return std::nullopt;
}

int Launch::wait_or_fail(std::chrono::milliseconds timeout) {
  const std::optional<int> status = wait_for(timeout);
  if (!status) {
    ADD_FAILURE() << "process " << pid_ << " still running after " << timeout.count()
                  << " ms; stderr so far:\n"
                  << err();
    return -1;
  }
  return *status;
}

std::string Launch::out() const {
  return read_file(files_ / "stdout");
}
std::string Launch::err() const {
  return read_file(files_ / "stderr");
}

RunResult run_xla_spawn(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  Launch launch(args);
  const int status = launch.wait_or_fail(timeout);
  RunResult result;
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.exit_code = status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = launch.out();
  result.err = launch.err();
  return result;
}

bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!condition()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

char process_state(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return '\0';  // gone meanwhile
  return stat[paren + 2];
}

bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  const char state = process_state(pid);
  return state != '\0' && state != 'Z' && state != 'X';
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<pid_t> wait_for_pids(const std::string& dir, int n, std::chrono::milliseconds timeout) {
  std::vector<pid_t> pids;
  const bool all = wait_until(
      [&] {
        for (int k = 0; k < n; ++k) {
          if (!std::filesystem::exists(dir + "/pid." + std::to_string(k))) return false;
        }
        return true;
      },
      timeout);
  if (!all) {
    ADD_FAILURE() << "not all " << n << " replicas wrote their pid to " << dir;
    return pids;
  }
  for (int k = 0; k < n; ++k) {
    pids.push_back(static_cast<pid_t>(std::stol(read_file(dir + "/pid." + std::to_string(k)))));
  }
  return pids;
}

std::vector<std::string> lines_with(const std::string& text, const std::string& prefix) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) lines.push_back(line);
  }
  return lines;
}

}  // namespace xs::testing
