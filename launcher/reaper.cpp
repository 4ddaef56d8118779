#include "xla_spawn/launcher/reaper.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/base/io.h"
#include "xla_spawn/base/trace.h"
#include "xla_spawn/launcher/exit_report.h"
#include "xla_spawn/launcher/helper_process.h"
#include "xla_spawn/replica/context.h"
#include "xla_spawn/shm/futex.h"
#include "xla_spawn/shm/segment.h"

namespace xs {
namespace {

constexpr const char* kReaperName = "xla-spawn-reap";  // its comm, at most 15 characters

// The first `max_bytes` of /proc/PID/FILE, empty when unreadable.
std::string proc_file(pid_t pid, const char* file, size_t max_bytes) {
  const int fd = ::open(fmt::format("/proc/{}/{}", pid, file).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string text;
  char buffer[16384];
  ssize_t n;
  while (text.size() < max_bytes && (n = ::read(fd, buffer, sizeof buffer)) > 0) {
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

// The NUL-separated environment of process `pid`, whole (the launcher's variables come last,
// after whatever the user exported: the kernel bounds it, at a quarter of the stack limit).
std::string environment_of(pid_t pid) {
  return proc_file(pid, "environ", size_t{1} << 30);
}

bool has_entry(const std::string& env, const std::string& entry) {
  for (size_t at = 0; at < env.size();) {
    const size_t end = std::min(env.find('\0', at), env.size());
    if (std::string_view(env).substr(at, end - at) == entry) return true;
    at = end + 1;
  }
  return false;
}

// What marks a process of this node's job: the job id and node its replicas were given, which
// whatever they start inherits (other jobs, and other nodes of this job on one machine,
// differ). Also where the replicas write their timeline's parts. The launcher sends the
// variables ("+m NAME=VALUE"); "-m NAME" forgets one (the trace, once the launcher merged it).
struct JobMark {
  std::map<std::string, std::string, std::less<>> vars;

  std::string entry(std::string_view name) const {
    const auto it = vars.find(name);
    return it == vars.end() ? std::string() : fmt::format("{}={}", name, it->second);
  }
  std::string value(std::string_view name) const {
    const auto it = vars.find(name);
    return it == vars.end() ? std::string() : it->second;
  }
  bool empty() const { return !vars.contains(env_names::kJobId) || !vars.contains(env_names::kNode); }
  bool marks(pid_t pid) const {
    const std::string env = environment_of(pid);
    return has_entry(env, entry(env_names::kJobId)) && has_entry(env, entry(env_names::kNode));
  }
};

// The process group of `pid` (/proc/PID/stat's fifth field), 0 when gone.
pid_t process_group(pid_t pid) {
  const std::optional<std::string> fields = process_stat_fields(pid);
  char state = 0;
  int ppid = 0, pgrp = 0;
  if (!fields || std::sscanf(fields->c_str(), "%c %d %d", &state, &ppid, &pgrp) != 3) return 0;
  return pgrp;
}

// The reaper of a job nested in this one (an xla-spawn run by a replica) carries this job's
// mark too, inherited by its launcher; it must live to clean up after its own job, whose
// launcher dies here. Known by its name and its program's, xla-spawn.
bool is_reaper(pid_t pid) {
  if (proc_file(pid, "comm", 64) != std::string(kReaperName) + "\n") return false;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink(fmt::format("/proc/{}/exe", pid), ec);
  return !ec && exe.filename() == "xla-spawn";
}

// SIGKILLs this user's processes that carry `mark`: what replicas started in sessions of their
// own (`setsid cmd &`), which the group kill misses and no subreaper will collect once the
// launcher is gone. A few rounds, for processes forked meanwhile. Returns how many, not
// counting members of `groups` (killed with their group already, and dying).
int kill_marked(const JobMark& mark, const std::set<pid_t>& groups) {
  if (mark.empty()) return 0;
  std::set<pid_t> killed;
  int strays = 0;
  for (int round = 0; round < 3; ++round) {
    bool found = false;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      const auto pid = static_cast<pid_t>(std::strtol(name.c_str(), nullptr, 10));
      struct stat st {};
      if (pid == ::getpid() || killed.contains(pid) || ::stat(entry.path().c_str(), &st) != 0 ||
          st.st_uid != ::getuid() || !mark.marks(pid) || is_reaper(pid)) {
        continue;
      }
      const bool in_group = groups.contains(process_group(pid));
      if (::kill(pid, SIGKILL) == 0) {
        killed.insert(pid);
        found = true;
        strays += in_group ? 0 : 1;
      }
    }
    if (!found) break;
    ::usleep(50'000);
  }
  return strays;
}

// The timeline of a launcher that died before its last merge: the parts the replicas wrote
// (up to their last flush) merged beside the --trace file, as STEM.JOB-ID.EXT (whatever is at
// the file itself may be another job's by now), after removing what a merge the launcher had
// begun left (FILE.merging.PID). Says what it did, or why not.
std::string merge_orphaned_trace(const JobMark& mark, pid_t launcher) {
  const std::string file = mark.value(trace::kFileEnv);
  const std::string job_id = mark.value(env_names::kJobId);
  if (file.empty() || job_id.empty()) return {};
  const std::string output = trace::tagged_path(file, job_id);
  for (const std::string& merged : {file, output}) {
    const std::string temp = fmt::format("{}.merging.{}", merged, launcher);
    struct stat st {};
    if (::lstat(temp.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::getuid()) {
      ::unlink(temp.c_str());
    }
  }
  if (trace::count_parts(file, job_id) == 0) return {};
  try {
    const std::string nnodes = mark.value(env_names::kNnodes);
    const int node =
        !nnodes.empty() && nnodes != "1" ? std::stoi(mark.value(env_names::kNode)) : -1;
    const size_t spans = trace::merge(file, job_id, node, /*remove_parts=*/true, output);
    return fmt::format("; the replicas' trace of {} span(s) written to {}", spans, output);
  } catch (const std::exception& e) {
    return fmt::format("; trace not written: {} (the parts, {}.{}.*.part, are kept)", e.what(),
                       file, job_id);
  }
}

// Lines on the pipe: "+s NAME", "-s NAME" (segment), "+g PGID", "-g PGID" (process group),
// "+m NAME=VALUE", "-m NAME" (the job's mark).
struct Tracked {
  std::set<std::string> segments;
  std::set<pid_t> groups;
  JobMark mark;

  void apply(std::string_view line) {
    if (line.size() < 4 || line[2] != ' ') return;
    const bool add = line[0] == '+';
    const std::string value(line.substr(3));
    if (line[1] == 's') {
      add ? (void)segments.insert(value) : (void)segments.erase(value);
    } else if (line[1] == 'g') {
      const pid_t pgid = static_cast<pid_t>(std::strtol(value.c_str(), nullptr, 10));
      if (pgid <= 1) return;
      add ? (void)groups.insert(pgid) : (void)groups.erase(pgid);
    } else if (line[1] == 'm') {
      const size_t eq = value.find('=');
      if (!add) {
        mark.vars.erase(value);
      } else if (eq != std::string::npos) {
        mark.vars[value.substr(0, eq)] = value.substr(eq + 1);
      }
    }
  }
};

// The reaper's whole life: record until EOF, then clean what is still recorded.
[[noreturn]] void reaper_main(int read_fd, pid_t launcher) {
  // Only fd 2 (for its one report line) and the pipe stay open.
  const int fd = isolate_helper_process(kReaperName, read_fd);
  // Out of the launcher's process group: `kill -9 -- -PGID` (or a shell killing the job) must
  // not take the reaper with the launcher, since cleaning up after that is its purpose. Job
  // control no longer reaches it either, so it ignores the stop signals of a background group.
  ::setpgid(0, 0);
  for (int signo : {SIGTSTP, SIGTTIN, SIGTTOU}) ::signal(signo, SIG_IGN);
  Tracked tracked;
  std::string pending;
  char buffer[4096];
  for (;;) {  // ends with the launcher: its death (or exit) closes the write end
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, static_cast<size_t>(n));
    for (size_t eol; (eol = pending.find('\n')) != std::string::npos; pending.erase(0, eol + 1)) {
      tracked.apply(std::string_view(pending).substr(0, eol));
    }
  }
  // Nothing left to clean when the launcher ended normally: its replicas reaped, its segment
  // removed, its trace merged.
  if (tracked.groups.empty() && tracked.segments.empty() &&
      tracked.mark.value(trace::kFileEnv).empty()) {
    ::_exit(0);
  }
  std::string killed;
  for (pid_t pgid : tracked.groups) {
    if (::kill(-pgid, SIGKILL) == 0) killed += fmt::format(" {}", pgid);
  }
  const int strays = tracked.groups.empty() ? 0 : kill_marked(tracked.mark, tracked.groups);
  std::string removed;
  for (const std::string& name : tracked.segments) {
    if (remove_segment(name)) removed += " " + name;
  }
  const std::string trace = merge_orphaned_trace(tracked.mark, launcher);
  if (tracked.groups.empty() && tracked.segments.empty() && trace.empty()) ::_exit(0);
  write_all(2, fmt::format("xla-spawn reaper: launcher pid {} is gone; SIGKILLed process "
                           "group(s):{}{}; removed segment(s):{}{}\n",
                           launcher, killed.empty() ? " none left" : killed,
                           strays == 0 ? "" : fmt::format(" and {} process(es) the replicas "
                                                          "started outside them", strays),
                           removed.empty() ? " none left" : removed, trace));
  ::_exit(0);
}

}  // namespace

Reaper::Reaper(JobResources* inner, JobMonitor* monitor) : inner_(inner), monitor_(monitor) {
  start();
}

void Reaper::start() {
  pid_ = -1;  // until a new one runs: never a pid that may be reused, nor waitpid(-1)'s "any"
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw IoError(errno_message("reaper pipe", errno));
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int saved = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    throw IoError(errno_message("fork of the reaper", saved));
  }
  if (pid == 0) {
    ::close(fds[1]);
    reaper_main(fds[0], launcher);
  }
  // Also done by the child; whichever runs first wins, so no group kill of the launcher's can
  // take the reaper before it has left. EACCES and ESRCH are harmless here.
  ::setpgid(pid, pid);
  pid_ = pid;
  ::close(fds[0]);
  write_fd_ = fds[1];
}

// A reaper killed on its own (its pid SIGKILLed by a user or the OOM killer) leaves the job
// unguarded: say so and start another, which learns what is tracked now.
void Reaper::restart_if_gone() noexcept {
  if (pid_ <= 0) return;  // none could be started: the stale sweep is the fallback
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) return;
  const pid_t old = pid_;
  if (write_fd_ >= 0) ::close(write_fd_);
  write_fd_ = -1;
  try {
    start();
  } catch (const Error& e) {
    write_all(2, fmt::format("xla-spawn: the reaper (pid {}) died ({}) and a new one could not be "
                             "started: {}; a segment left by a killed launcher is swept at the next start\n",
                             old, describe_status(status), e.what()));
    return;
  }
  write_all(2, fmt::format("xla-spawn: the reaper (pid {}) died ({}); started a new one (pid {})\n", old,
                           describe_status(status), pid_));
  if (!segment_.empty()) send('+', 's', segment_);
  for (pid_t pgid : groups_) send('+', 'g', std::to_string(pgid));
  for (const auto& [name, value] : mark_) send('+', 'm', fmt::format("{}={}", name, value));
}

std::optional<std::string> Reaper::check(std::span<const pid_t> pids_by_ordinal) noexcept {
  restart_if_gone();
  return monitor_ != nullptr ? monitor_->check(pids_by_ordinal) : std::nullopt;
}

Reaper::~Reaper() {
  if (write_fd_ >= 0) ::close(write_fd_);
  if (pid_ <= 0) return;
  // Bounded: the reaper only has to read EOF (and clean whatever is still recorded).
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    while (::poll(&p, 1, kExitWaitMs) < 0 && errno == EINTR) {
    }
    ::close(pidfd);
  }
  int status = 0;
  ::waitpid(pid_, &status, WNOHANG);  // a reaper that hangs is left to init, not waited for
}

std::vector<EnvVar> Reaper::prepare(const std::string& job_id, int world_size, int attempt) {
  std::vector<EnvVar> env =
      inner_ != nullptr ? inner_->prepare(job_id, world_size, attempt) : std::vector<EnvVar>();
  for (const EnvVar& var : env) {
    if (var.name == env_names::kSegment && var.value) {
      segment_ = *var.value;
      send('+', 's', segment_);
    }
  }
  return env;
}

void Reaper::release() noexcept {
  if (inner_ != nullptr) inner_->release();
  if (!segment_.empty()) send('-', 's', segment_);
  segment_.clear();
}

void Reaper::job_environment(const std::vector<EnvVar>& env) noexcept {
  try {
    for (const char* name : {env_names::kJobId, env_names::kNode, env_names::kNnodes,
                             trace::kFileEnv}) {
      std::optional<std::string> value;  // the last setting of `name` wins, as in the replica
      for (const EnvVar& var : env) {
        if (var.name == name) value = var.value;
      }
      if (value && value->find('\n') == std::string::npos) {
        mark_[name] = *value;
        send('+', 'm', fmt::format("{}={}", name, *value));
      } else if (mark_.erase(name) > 0) {
        send('-', 'm', name);
      }
    }
  } catch (const std::exception&) {  // allocation only: the reaper then marks less
  }
}

void Reaper::trace_merged() noexcept {
  if (mark_.erase(trace::kFileEnv) > 0) send('-', 'm', trace::kFileEnv);
}

void Reaper::replica_started(pid_t pid) noexcept {
  groups_.insert(pid);
  send('+', 'g', std::to_string(pid));
}

void Reaper::replica_reaped(pid_t pid) noexcept {
  groups_.erase(pid);
  send('-', 'g', std::to_string(pid));
}

void Reaper::send(char op, char kind, const std::string& value) noexcept {
  if (write_fd_ < 0) return;
  const std::string line = fmt::format("{}{} {}\n", op, kind, value);
  // Lines are far below PIPE_BUF, so each write is atomic; EPIPE means the reaper is gone.
  ssize_t n;
  while ((n = ::write(write_fd_, line.data(), line.size())) < 0 && errno == EINTR) {
  }
  if (n != static_cast<ssize_t>(line.size())) {
    ::close(write_fd_);
    write_fd_ = -1;
  }
}

}  // namespace xs
