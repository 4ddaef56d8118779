#include "tests/support/namespace_cluster.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "tests/support/deadline_scale.h"

extern char** environ;

namespace xs::testing {
namespace {

using Clock = std::chrono::steady_clock;

const std::string kScript = XS_SOURCE_DIR "/scripts/cluster";
// scripts/cluster's exit code when clusters cannot be built here (automake's "skip").
constexpr int kExitSkip = 77;
// `up` of 64 hosts takes ~6 s on an idle 2-core machine, `down` ~2 s; a loaded one is slower.
constexpr std::chrono::seconds kUpDownTimeout{120};
// Every other subcommand runs a handful of short processes.
constexpr std::chrono::seconds kQueryTimeout{30};

// Raw system calls: Debian 12's glibc 2.36 declares these in <sys/pidfd.h> without extern "C".
int pidfd_open(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}
int pidfd_kill(int pidfd) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0));
}

// A file descriptor closed on destruction.
class Fd {
 public:
  explicit Fd(int fd, const std::string& what) : fd_(fd) {
    if (fd_ < 0) throw IoError(errno_message(what, errno));
  }
  ~Fd() { close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// argv or envp for execve, built before fork: the child of a possibly threaded process may
// only make async-signal-safe calls, so it must not allocate.
class CStrings {
 public:
  explicit CStrings(std::vector<std::string> strings) : strings_(std::move(strings)) {
    for (std::string& s : strings_) pointers_.push_back(s.data());
    pointers_.push_back(nullptr);
  }
  CStrings(const CStrings&) = delete;
  CStrings& operator=(const CStrings&) = delete;
  char* const* get() const { return pointers_.data(); }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> pointers_;
};

// This process's environment with `extra` added, replacing variables of the same name.
std::vector<std::string> environment_with(const EnvVars& extra) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const std::string_view key = text.substr(0, text.find('='));
    const bool replaced =
        std::any_of(extra.begin(), extra.end(), [&](const auto& kv) { return kv.first == key; });
    if (!replaced) env.emplace_back(text);
  }
  for (const auto& [key, value] : extra) env.push_back(key + "=" + value);
  return env;
}

[[noreturn]] void exec_child(int in, int out, int err, const CStrings& argv, const CStrings& envp) {
  if (::dup2(in, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(126);
  ::execve(argv.get()[0], argv.get(), envp.get());
  ::_exit(127);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {}", WTERMSIG(status));
  return fmt::format("ended with wait status {:#x}", status);
}

int reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw IoError(errno_message(fmt::format("waitpid({})", pid), errno));
  }
  return status;
}

// Reads `fds` until each is at end of file; false when `deadline` passes first.
bool drain(const std::array<int, 2>& fds, const std::array<std::string*, 2>& into,
           Clock::time_point deadline) {
  std::array<pollfd, 2> polls{{{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}}};
  char buffer[4096];
  while (polls[0].fd >= 0 || polls[1].fd >= 0) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    if (::poll(polls.data(), polls.size(), static_cast<int>(left.count())) < 0) {
      if (errno == EINTR) continue;
      throw IoError(errno_message("poll on a command's output", errno));
    }
    for (size_t i = 0; i < polls.size(); ++i) {
      if (polls[i].fd < 0 || polls[i].revents == 0) continue;
      const ssize_t n = ::read(polls[i].fd, buffer, sizeof buffer);
      if (n > 0) into[i]->append(buffer, static_cast<size_t>(n));
      if (n == 0 || (n < 0 && errno != EINTR)) polls[i].fd = -1;  // -1: poll skips it
    }
  }
  return true;
}

// Runs argv (argv[0] a path) to completion with stdout and stderr captured; kills it (and
// everything it started) and throws xs::Timeout when it is still running after `timeout`.
CommandResult capture(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const CStrings args(argv);
  const CStrings env(environment_with({}));
  std::array<int, 2> out{}, err{};
  if (::pipe2(out.data(), O_CLOEXEC) != 0) throw IoError(errno_message("pipe2", errno));
  Fd out_read(out[0], "pipe2"), out_write(out[1], "pipe2");
  if (::pipe2(err.data(), O_CLOEXEC) != 0) throw IoError(errno_message("pipe2", errno));
  Fd err_read(err[0], "pipe2"), err_write(err[1], "pipe2");
  const Fd null(::open("/dev/null", O_RDONLY | O_CLOEXEC), "open /dev/null");
  const pid_t pid = ::fork();
  if (pid < 0) throw IoError(errno_message("fork for " + argv[0], errno));
  if (pid == 0) {
    ::setpgid(0, 0);  // its own process group, so a timeout kills the children it is waiting for
    exec_child(null.get(), out_write.get(), err_write.get(), args, env);
  }
  out_write.close();
  err_write.close();
  CommandResult result;
  if (!drain({out_read.get(), err_read.get()}, {&result.out, &result.err}, deadline)) {
    ::kill(-pid, SIGKILL);
    reap(pid);
    throw Timeout(fmt::format("`{}` still running after {} ms; stderr so far: {}",
                              fmt::join(argv, " "), timeout.count(), result.err));
  }
  result.status = reap(pid);
  return result;
}

std::string describe_failure(const std::vector<std::string>& args, const CommandResult& r) {
  return fmt::format("`scripts/cluster {}` {}: {}{}", fmt::join(args, " "),
                     describe_status(r.status), r.err, r.out);
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> result;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) result.push_back(line);
  return result;
}

// t<pid>x<instance>: unique among the clusters of live processes, at most 12 characters
// (pid <= 4194304, the kernel's pid_max limit), as scripts/cluster requires.
std::string unique_name() {
  static std::atomic<unsigned> instances{0};
  return fmt::format("t{}x{}", ::getpid(), instances++ % 1000);
}

}  // namespace

bool CommandResult::ok() const {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::optional<std::string> namespace_cluster_unavailable() {
  static const std::optional<std::string> reason = []() -> std::optional<std::string> {
    const CommandResult r = capture({kScript, "check"}, scaled(kQueryTimeout));
    if (r.ok()) return std::nullopt;
    if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == kExitSkip) {
      return r.err.substr(0, r.err.find_last_not_of('\n') + 1);
    }
    throw IoError(describe_failure({"check"}, r));
  }();
  return reason;
}

NamespaceCluster::NamespaceCluster(int hosts, const ClusterOptions& options)
    : name_(unique_name()), hosts_(hosts) {
  std::vector<std::string> args = {"up", name_, std::to_string(hosts)};
  if (!options.rate.empty()) args.insert(args.end(), {"--rate", options.rate});
  if (!options.shm_size.empty()) args.insert(args.end(), {"--shm-size", options.shm_size});
  up_ = true;  // from here on down() has something to do, even when `up` fails
  CommandResult r;
  try {
    r = script(args, scaled(kUpDownTimeout));
  } catch (const Timeout&) {
    down();  // killed half-way, `up` could not remove what it had built
    throw;
  }
  if (!r.ok()) {
    // A failing `up` cleans up after itself, a killed one cannot.
    if (WIFSIGNALED(r.status)) down();
    throw IoError(describe_failure(args, r));
  }
}

NamespaceCluster::~NamespaceCluster() {
  try {
    down();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "cluster " << name_ << " not torn down: " << e.what();
  }
  // down() killed what ran in the hosts; this catches a child still on its way in.
  for (const int pidfd : spawned_pidfds_) {
    pidfd_kill(pidfd);  // ESRCH when it has exited already
    siginfo_t info{};
    ::waitid(P_PIDFD, static_cast<id_t>(pidfd), &info, WEXITED);  // ECHILD: the caller reaped it
    ::close(pidfd);
  }
}

std::string NamespaceCluster::addr(int host) const {
  const std::string out = script_ok({"addr", name_, host_arg(host)});
  return out.substr(0, out.find('\n'));
}

std::string NamespaceCluster::hostname(int host) const {
  return name_ + "-h" + host_arg(host);
}

pid_t NamespaceCluster::spawn(int host, const std::vector<std::string>& argv,
                              const std::string& log_path, const EnvVars& extra_env) {
  if (argv.empty()) throw InvalidArgument(fmt::format("cluster {}: spawn of no command", name_));
  std::vector<std::string> full = {kScript, "run", name_, host_arg(host), "--"};
  full.insert(full.end(), argv.begin(), argv.end());
  const CStrings args(full);
  const CStrings env(environment_with(extra_env));
  const Fd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644),
               "open " + log_path);
  const Fd null(::open("/dev/null", O_RDONLY | O_CLOEXEC), "open /dev/null");
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw IoError(errno_message("fork for " + argv[0], errno));
  if (pid == 0) {
    // The parent-death signal survives exec; getppid() catches a parent that died before it.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(126);
    exec_child(null.get(), log.get(), log.get(), args, env);
  }
  const int pidfd = pidfd_open(pid);  // cannot fail for an unreaped child, but say so
  if (pidfd < 0) throw IoError(errno_message(fmt::format("pidfd_open({})", pid), errno));
  spawned_pidfds_.push_back(pidfd);
  return pid;
}

CommandResult NamespaceCluster::run(int host, const std::vector<std::string>& argv,
                                    std::chrono::milliseconds timeout) const {
  std::vector<std::string> args = {"run", name_, host_arg(host), "--"};
  args.insert(args.end(), argv.begin(), argv.end());
  return script(args, timeout);
}

void NamespaceCluster::set_link(int host, bool up) {
  script_ok({"link", name_, host_arg(host), up ? "up" : "down"});
}

void NamespaceCluster::blackhole_link(int host) {
  script_ok({"link", name_, host_arg(host), "blackhole"});
}

bool NamespaceCluster::hold_flow(int host, uint16_t port) {
  const std::vector<std::string> args = {"hold", name_, host_arg(host), std::to_string(port)};
  const CommandResult r = script(args, scaled(kQueryTimeout));
  if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == 77) return false;
  if (!r.ok()) throw IoError(describe_failure(args, r));
  return true;
}

void NamespaceCluster::shape(int host, const std::string& rate) {
  script_ok({"shape", name_, host_arg(host), rate});
}

std::vector<pid_t> NamespaceCluster::pids(int host) const {
  std::vector<pid_t> result;
  for (const std::string& line : lines(script_ok({"pids", name_, host_arg(host)}))) {
    result.push_back(static_cast<pid_t>(std::stol(line)));
  }
  return result;
}

std::vector<std::string> NamespaceCluster::shm_entries(int host) const {
  return lines(script_ok({"shm", name_, host_arg(host)}));
}

std::pair<uint64_t, uint64_t> NamespaceCluster::bytes(int host) const {
  const std::string out = script_ok({"bytes", name_, host_arg(host)});
  std::istringstream in(out);
  std::pair<uint64_t, uint64_t> tx_rx;
  if (!(in >> tx_rx.first >> tx_rx.second)) {
    throw IoError(fmt::format("scripts/cluster bytes {} {}: expected \"tx rx\", got \"{}\"", name_,
                              host, out));
  }
  return tx_rx;
}

void NamespaceCluster::down() {
  if (!up_) return;
  const std::vector<std::string> args = {"down", name_};
  const CommandResult r = script(args, scaled(kUpDownTimeout));
  if (!r.ok()) throw IoError(describe_failure(args, r));
  up_ = false;
}

CommandResult NamespaceCluster::script(const std::vector<std::string>& args,
                                       std::chrono::milliseconds timeout) const {
  std::vector<std::string> argv = {kScript};
  argv.insert(argv.end(), args.begin(), args.end());
  return capture(argv, timeout);
}

std::string NamespaceCluster::script_ok(const std::vector<std::string>& args) const {
  const CommandResult r = script(args, scaled(kQueryTimeout));
  if (!r.ok()) throw IoError(describe_failure(args, r));
  return r.out;
}

std::string NamespaceCluster::host_arg(int host) const {
  if (host < 0 || host >= hosts_) {
    throw InvalidArgument(
        fmt::format("cluster {}: host {} out of range 0..{}", name_, host, hosts_ - 1));
  }
  return std::to_string(host);
}

std::optional<int> wait_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const Fd pidfd(pidfd_open(pid), fmt::format("pidfd_open({}): not a child to wait for", pid));
  const auto deadline = Clock::now() + timeout;
  pollfd p{pidfd.get(), POLLIN, 0};
  while (true) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    const int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (ready > 0) return reap(pid);
    if (ready == 0) return std::nullopt;
    if (errno != EINTR) throw IoError(errno_message(fmt::format("poll on pid {}", pid), errno));
  }
}

bool poll_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!condition()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace xs::testing
