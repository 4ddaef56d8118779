#include "xla_spawn/launcher/detail/attempt.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/base/int_ranges.h"
#include "xla_spawn/shm/futex.h"

namespace xs::detail {
namespace {

// After the last replica is reaped, wait this long for its pipes to reach EOF: only a
// grandchild that kept them open can delay EOF, and it must not hold the job hostage.
constexpr auto kDrainAfterExit = std::chrono::milliseconds(500);
// 64 KiB per read: one pipe's default capacity, so one read usually empties it.
constexpr size_t kReadBytes = 64 * 1024;

int open_pidfd(pid_t pid) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) throw IoError(errno_message(fmt::format("pidfd_open({})", pid), errno));
  return fd;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// The CPUs this process may run on, in order; ordinal k is pinned to cpus[k % size].
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) {
    throw IoError(errno_message("sched_getaffinity", errno));
  }
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

bool binds_cores(CoreBinding binding, int nprocs) {
  switch (binding) {
    case CoreBinding::kOn:
      return true;
    case CoreBinding::kOff:
      return false;
    case CoreBinding::kAuto:
      return nprocs >= 2 && nprocs <= static_cast<int>(allowed_cpus().size());
  }
  return false;
}

// The group reaches the replica's own children too; the pid alone covers a replica that left
// its group (setsid in the program). Once, not twice: a handler may count signals.
void signal_replica(pid_t pid, int signo) {
  if (::kill(-pid, signo) != 0 && errno == ESRCH) ::kill(pid, signo);
}

}  // namespace

Attempt::Attempt(const JobContext& job, int attempt)
    : job_(job), attempt_(attempt), replicas_(static_cast<size_t>(job.nprocs)) {
  for (int k = 0; k < job.nprocs; ++k) replicas_[static_cast<size_t>(k)].ordinal = k;
}

Attempt::~Attempt() {
  for (Replica& r : replicas_) {
    if (r.pid > 0 && !r.reaped) {
      signal_replica(r.pid, SIGKILL);
      int status = 0;
      while (::waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
      }
      if (job_.options->observer != nullptr) job_.options->observer->replica_reaped(r.pid);
    }
    close_fd(r.pidfd);
    close_fd(r.pipe_fds[0]);
    close_fd(r.pipe_fds[1]);
  }
}

AttemptResult Attempt::run(const std::vector<EnvVar>& extra_env) {
  started_ = Clock::now();
  start(extra_env);
  while (!done()) {
    poll_once();
    check_deadlines();
    check_monitor();
    check_peers();
  }
  // A job that failed another way may still have a scribbled segment behind it: say so.
  if (reason_ != StopReason::kNone && reason_ != StopReason::kMonitor &&
      job_.options->monitor != nullptr) {
    std::vector<pid_t> pids;
    for (const Replica& r : replicas_) pids.push_back(r.pid);
    finding_ = job_.options->monitor->check(pids).value_or("");
  }
  // After a collective timed out, the hang report already ended with the straggler line
  // (format_calls) from the same counts: no collective completes in a poisoned segment.
  if (job_.options->monitor != nullptr && !hang_reported_) {
    const std::string straggler = job_.options->monitor->straggler_report(
        job_.placement.first_ordinal, job_.placement.nnodes > 1);
    if (!straggler.empty()) job_.mux->message(straggler);
  }
  for (Replica& r : replicas_) {  // pipes a grandchild kept open: flush what we have
    for (int stream = 0; stream < 2; ++stream) {
      if (r.pipe_fds[stream] < 0) continue;
      job_.mux->on_eof(r.ordinal, static_cast<ReplicaStream>(stream));
      close_fd(r.pipe_fds[stream]);
    }
  }
  return result();
}

void Attempt::start(const std::vector<EnvVar>& extra_env) {
  const std::vector<int> cpus =
      binds_cores(job_.options->bind_cores, static_cast<int>(replicas_.size()))
          ? allowed_cpus()
          : std::vector<int>();
  // Buffered stdio would be copied into every child and written N + 1 times.
  std::fflush(nullptr);
  for (Replica& r : replicas_) start_one(r, extra_env, cpus);
}

void Attempt::start_one(Replica& replica, const std::vector<EnvVar>& extra_env,
                        const std::vector<int>& cpus) {
  int out[2];
  int err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    throw IoError(errno_message(fmt::format("stdout pipe for ordinal {}", replica.ordinal), errno));
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw IoError(errno_message(fmt::format("stderr pipe for ordinal {}", replica.ordinal), errno));
  }
  replica.pipe_fds[0] = out[0];
  replica.pipe_fds[1] = err[0];
  ChildSetup setup;
  setup.ordinal = replica.ordinal;
  setup.parent_pid = ::getpid();
  setup.stdout_fd = out[1];
  setup.stderr_fd = err[1];
  setup.close_fds = {job_.signals->read_fd(), job_.signals->write_fd()};
  for (const Replica& other : replicas_) {
    for (int fd : {other.pidfd, other.pipe_fds[0], other.pipe_fds[1]}) {
      if (fd >= 0) setup.close_fds.push_back(fd);
    }
  }
  if (!cpus.empty()) setup.cpu = cpus[static_cast<size_t>(replica.ordinal) % cpus.size()];
  const ReplicaPlace place{global(replica.ordinal), replica.ordinal, job_.placement.world_size,
                          job_.nprocs};
  setup.env = replica_env(job_.job_id, place, attempt_, extra_env);
  if (replica.ordinal == 0 && job_.options->observer != nullptr) {
    job_.options->observer->job_environment(setup.env);
  }
  try {
    replica.pid = job_.options->exec != nullptr ? spawn_replica(setup, *job_.options->exec)
                                                : fork_replica(setup, *job_.body);
  } catch (...) {
    ::close(out[1]);
    ::close(err[1]);
    throw;
  }
  ::close(out[1]);  // the child holds the write ends now; EOF comes when it (and its kids) exit
  ::close(err[1]);
  if (job_.options->observer != nullptr) job_.options->observer->replica_started(replica.pid);
  replica.pidfd = open_pidfd(replica.pid);
}

void Attempt::poll_once() {
  std::vector<pollfd> fds;
  std::vector<std::pair<Replica*, int>> owners;  // stream 0/1, or 2 for the pidfd
  fds.push_back({job_.signals->read_fd(), POLLIN, 0});
  owners.emplace_back(nullptr, 0);
  // The other nodes: check_peers() reads it after the poll (the entry is only a wake-up).
  if (job_.options->peers != nullptr && job_.options->peers->fd() >= 0) {
    fds.push_back({job_.options->peers->fd(), POLLIN, 0});
    owners.emplace_back(nullptr, 3);
  }
  for (Replica& r : replicas_) {
    for (int stream = 0; stream < 2; ++stream) {
      if (r.pipe_fds[stream] < 0) continue;
      fds.push_back({r.pipe_fds[stream], POLLIN, 0});
      owners.emplace_back(&r, stream);
    }
    if (!r.reaped) {
      fds.push_back({r.pidfd, POLLIN, 0});
      owners.emplace_back(&r, 2);
    }
  }
  const int ready = ::poll(fds.data(), fds.size(), timeout_ms_until_next_deadline());
  if (ready < 0 && errno != EINTR) throw IoError(errno_message("poll", errno));
  if (ready <= 0) return;
  if (fds[0].revents != 0) handle_signals();
  // Output before exits: the root cause's last lines are then already in its tail.
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents != 0 && owners[i].first != nullptr && owners[i].second < 2) {
      read_pipe(*owners[i].first, owners[i].second);
    }
  }
  std::vector<Replica*> failed;  // reaped in this wake-up, in ordinal order
  for (size_t i = 1; i < fds.size(); ++i) {
    if (owners[i].first == nullptr) continue;
    Replica& r = *owners[i].first;
    if (fds[i].revents == 0 || owners[i].second != 2 || !reap(r)) continue;
    if (!is_failure(r.status)) {
      if (reason_ == StopReason::kNone) ended_.push_back(r.ordinal);
      continue;
    }
    failed.push_back(&r);
    // Every failure we did not cause, even after a stop: the job's root cause is chosen among
    // all nodes' reports.
    if (!r.signalled) tell_peers(r);
  }
  if (!failed.empty() && reason_ == StopReason::kNone) {
    reap_the_dying(failed);
    on_failure(root_cause(failed));
  }
  if (running() == 0 && !drain_deadline_) drain_deadline_ = Clock::now() + kDrainAfterExit;
}

// How long a replica found dying may take to become reapable, at most.
constexpr int kDyingReapWaitMs = 2000;

// Before the first failure is judged, the replicas already dead but not yet reapable join it.
// A replica SIGKILLed with several threads is a zombie (its state Z) as soon as its main
// thread goes, but reapable only once every thread has: a peer that sees it gone exits with
// code 1 meanwhile, is reaped first, and would be taken for the root cause, the killed one
// for a replica this launcher stopped. Nothing has been signalled yet, so such a death is not
// ours; its wait is bounded.
void Attempt::reap_the_dying(std::vector<Replica*>& failed) {
  // A signalled failure is already the root cause over any exit (root_cause()).
  for (const Replica* r : failed) {
    if (WIFSIGNALED(r->status)) return;
  }
  std::vector<Replica*> dying;
  for (Replica& r : replicas_) {
    if (!r.reaped && !process_alive(r.pid)) dying.push_back(&r);
  }
  // One bound for all of them: a process whose main thread left by pthread_exit is a zombie
  // leader too, with other threads running on, and must not hold the launcher long.
  const auto until = Clock::now() + std::chrono::milliseconds(kDyingReapWaitMs);
  while (!dying.empty() && Clock::now() < until) {
    std::vector<pollfd> fds;
    for (const Replica* r : dying) fds.push_back({r->pidfd, POLLIN, 0});
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
    if (::poll(fds.data(), fds.size(), static_cast<int>(left)) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      Replica& r = *dying[i];
      if (fds[i].revents == 0 || !reap(r) || !is_failure(r.status)) continue;
      tell_peers(r);
      failed.insert(std::upper_bound(failed.begin(), failed.end(), &r,
                                     [](const Replica* a, const Replica* b) {
                                       return a->ordinal < b->ordinal;
                                     }),
                    &r);
    }
    std::erase_if(dying, [](const Replica* r) { return r->reaped; });
  }
}

// Of failures reaped together, a replica killed by a signal is the root cause before one that
// exited with a code: a replica whose peer vanished exits with code 1 (PeerFailure) within
// 0.1 s of the peer's SIGKILL, and a launcher slow to wake (a loaded machine, TSan) reaps both
// in one pass. Otherwise the lowest ordinal, as before.
Attempt::Replica& Attempt::root_cause(const std::vector<Replica*>& failed) {
  for (Replica* r : failed) {
    if (WIFSIGNALED(r->status)) return *r;
  }
  return *failed.front();
}

int Attempt::timeout_ms_until_next_deadline() const {
  std::optional<Clock::time_point> next = kill_deadline_;
  if (drain_deadline_ && (!next || *drain_deadline_ < *next)) next = drain_deadline_;
  if (reason_ == StopReason::kNone && job_.deadline != Clock::time_point::max() &&
      (!next || job_.deadline < *next)) {
    next = job_.deadline;
  }
  if (job_.options->peers != nullptr && (!next || job_.options->peers->deadline() < *next)) {
    next = job_.options->peers->deadline();
  }
  if (reason_ == StopReason::kNone && job_.options->monitor != nullptr &&
      (!next || next_monitor_check_ < *next)) {
    next = next_monitor_check_;
  }
  if (!next) return -1;  // only replica events can end the wait; --timeout bounds the job
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 3'600'000));
}

// When another node stops the job while a replica here has been inside a collective call this
// long, this node's hang report and stacks are printed first.
constexpr double kReportAfterPeerStopS = 2.0;

void Attempt::note_interrupt(int signo) {
  interrupted_ = true;
  stop_signal_ = signo;
  stop_signal_at_ = Clock::now();
  tell_peers(LocalFailureKind::kInterrupted, 128 + signo,
             fmt::format("was interrupted by {}", signal_name(signo)));
}

void Attempt::handle_signals() {
  for (int signo : job_.signals->drain()) {
    if (signo == SIGTSTP) {
      suspend();
    } else if (signo == SIGUSR1) {
      report_calls("SIGUSR1", /*failing=*/false);
    } else if (reason_ == StopReason::kNone) {
      reason_ = StopReason::kSignal;
      note_interrupt(signo);
      job_.mux->message(fmt::format(
          "received {}; forwarding it to {} replica(s), SIGKILL after {} ms (again: kill now)",
          signal_name(signo), running(), job_.options->grace.count()));
      stop_all(signo);
    } else if (!interrupted_) {
      // This node's first interrupt, with the job already stopping (another node's interrupt
      // or failure, a replica's failure, the timeout): a scheduler signals every node at
      // once, and a node that heard of another's signal first must not take its own for a
      // second one. The replicas have had their SIGTERM; the grace period runs on.
      // The job ends here, then: an interrupted job is not restarted (result()), and the
      // other nodes hear of it (an interrupt is the root cause that restarts nothing).
      note_interrupt(signo);
      job_.mux->message(fmt::format(
          "received {} while already stopping {} replica(s); no restart, SIGKILL when the "
          "grace period ends (again: kill now)",
          signal_name(signo), running()));
    } else if (signo == stop_signal_ && Clock::now() - stop_signal_at_ < kRepeatWindow) {
      job_.mux->message(fmt::format("received {} again within {} ms: the same interrupt "
                                    "delivered twice, still stopping",
                                    signal_name(signo), kRepeatWindow.count()));
    } else {
      const std::string again = signo == stop_signal_
                                    ? std::string(" again")
                                    : fmt::format(" after {}", signal_name(stop_signal_));
      job_.mux->message(fmt::format("received {}{}; killing {} replica(s) now",
                                    signal_name(signo), again, running()));
      kill_all();
    }
  }
}

// Ctrl-Z (SIGTSTP) stops the whole job, as a shell expects of a job: left running, replicas
// would block writing to the stopped launcher's pipes and their peers would time out blaming
// them. The replicas' groups get SIGSTOP before xla-spawn stops itself, and SIGCONT once it is
// continued (fg, kill -CONT); their collective waits do not count the time they were stopped.
void Attempt::suspend() {
  job_.mux->message(fmt::format("received SIGTSTP; stopping {} replica(s) with xla-spawn", running()));
  for (Replica& r : replicas_) {
    if (!r.reaped) signal_replica(r.pid, SIGSTOP);
  }
  ::raise(SIGSTOP);  // returns once continued
  for (Replica& r : replicas_) {
    if (!r.reaped) signal_replica(r.pid, SIGCONT);
  }
  job_.mux->message(fmt::format("continued; continuing {} replica(s)", running()));
}

std::string Attempt::describe(const Replica& replica) const {
  const std::string status = describe_status(replica.status);
  return replica.oom ? fmt::format("{}, sent by {}", status, *replica.oom) : status;
}

bool Attempt::reap(Replica& replica) {
  // Whatever the replica started in its process group (`cmd &` in a shell, a helper that
  // ignores SIGTERM) must not outlive it, however it ended. Killed before the wait: while the
  // replica is an unreaped zombie its pid, and so its group's id, cannot be reused.
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(replica.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != replica.pid) {
    return false;  // not yet (pidfd readiness and waitid agree; EINTR retries)
  }
  ::kill(-replica.pid, SIGKILL);
  int status = 0;
  const pid_t pid = ::waitpid(replica.pid, &status, WNOHANG);
  if (pid != replica.pid) return false;
  replica.reaped = true;
  replica.status = status;
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && !replica.killed) {
    replica.oom = oom_.explain_sigkill(replica.pid);
  }
  if (job_.options->observer != nullptr) job_.options->observer->replica_reaped(replica.pid);
  close_fd(replica.pidfd);
  return true;
}

// What every ordinal is doing, from the segment's call records: on SIGUSR1, and when a
// collective timed out (before the others are stopped, so their state is still what hung).
// When the job is failing (a collective timed out), then each replica's stack
// (shm/stack_dump.h), printed by the replica itself, stopped ones continued for it, read here
// for up to kStackWait before the job is stopped. Not on SIGUSR1: a handled signal cuts a
// replica's sleeps short, and one taken on the interrupted stack inside oneDNN's GEMM corrupted
// the heap (shm/stack_dump.h), so a healthy job is not signalled.
void Attempt::report_calls(const std::string& why, bool failing) {
  if (job_.options->monitor == nullptr) return;
  std::vector<pid_t> pids;
  for (const Replica& r : replicas_) pids.push_back(r.reaped ? 0 : r.pid);
  const std::string report =
      job_.options->monitor->call_report(pids, job_.placement.first_ordinal,
                                         job_.placement.nnodes > 1);
  if (report.empty()) return;
  job_.mux->message(fmt::format("hang report ({}):\n{}", why, report.substr(0, report.size() - 1)));
  if (!failing) return;
  hang_reported_ = true;
  job_.mux->expect_stacks();
  const int asked = job_.options->monitor->request_stacks(pids, /*continue_stopped=*/true);
  if (asked > 0) read_output_until([&] { return job_.mux->stacks_complete(asked); });
}

void Attempt::read_output_until(const std::function<bool()>& done) {
  const auto until = Clock::now() + kStackWait;
  for (auto now = Clock::now(); now < until && !done(); now = Clock::now()) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Replica*, int>> owners;
    for (Replica& r : replicas_) {
      for (int stream = 0; stream < 2; ++stream) {
        if (r.pipe_fds[stream] < 0) continue;
        fds.push_back({r.pipe_fds[stream], POLLIN, 0});
        owners.emplace_back(&r, stream);
      }
    }
    if (fds.empty()) return;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(left));
    if (ready < 0 && errno != EINTR) return;
    for (size_t i = 0; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].revents != 0) read_pipe(*owners[i].first, owners[i].second);
    }
  }
}

void Attempt::on_failure(const Replica& replica) {
  if (job_.options->monitor != nullptr && job_.options->monitor->timed_out()) {
    report_calls("a collective timed out", /*failing=*/true);
  }
  reason_ = StopReason::kFailure;
  root_ = replica.ordinal;
  const int others = running();
  if (others > 0) {
    job_.mux->message(fmt::format(
        "ordinal {} {}; stopping the other {} replica(s) (SIGTERM, SIGKILL after {} ms)",
        global(replica.ordinal), describe(replica), others,
        job_.options->grace.count()));
  }
  stop_all(SIGTERM);
}

void Attempt::tell_peers(const Replica& replica) {
  if (job_.options->peers == nullptr) return;
  LocalFailure f;
  f.local_ordinal = replica.ordinal;
  f.kind = WIFSIGNALED(replica.status) ? LocalFailureKind::kSignalled : LocalFailureKind::kExited;
  f.exit_code = exit_code_for_status(replica.status);
  f.description = describe(replica);
  const auto& tail = job_.mux->tail(replica.ordinal);
  f.tail.assign(tail.begin(), tail.end());
  job_.options->peers->local_failure(f);
}

void Attempt::tell_peers(LocalFailureKind kind, int exit_code, const std::string& description) {
  if (job_.options->peers == nullptr) return;
  LocalFailure f;
  f.kind = kind;
  f.exit_code = exit_code;
  f.description = description;
  job_.options->peers->local_failure(f);
}

// Another node failed (or the job ended meanwhile): stop this node's replicas as after a
// local failure, but none of them is to blame.
void Attempt::check_peers() {
  if (job_.options->peers == nullptr) return;
  std::optional<PeerStop> stop = job_.options->peers->service();
  if (!stop) return;
  if (stop->job_over || !peer_stop_) peer_stop_ = *stop;
  if (reason_ != StopReason::kNone) return;
  reason_ = StopReason::kPeers;
  // Replicas here waiting inside a collective call for seconds when another node stops the
  // job: one of them, or the replica here they wait for, may be what made the other node's
  // collective time out, and only this node's records and stacks can show it. (Replicas
  // between calls, computing or evaluating, say nothing of a hang and are left alone.)
  if (job_.options->monitor != nullptr) {
    const double waited_s = job_.options->monitor->longest_wait_s();
    if (waited_s >= kReportAfterPeerStopS) {
      report_calls(fmt::format("the job stops for another node; a replica here has been inside "
                               "a collective call for {:.1f} s",
                               waited_s),
                   /*failing=*/true);
    }
  }
  job_.mux->message(fmt::format("{}; stopping {} replica(s) (SIGTERM, SIGKILL after {} ms)",
                                stop->reason, running(), job_.options->grace.count()));
  stop_all(SIGTERM);
}

void Attempt::read_pipe(Replica& replica, int stream) {
  char buffer[kReadBytes];
  const ssize_t n = ::read(replica.pipe_fds[stream], buffer, sizeof buffer);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  const auto which = static_cast<ReplicaStream>(stream);
  if (n > 0) {
    job_.mux->on_bytes(replica.ordinal, which, std::string_view(buffer, static_cast<size_t>(n)));
    return;
  }
  job_.mux->on_eof(replica.ordinal, which);  // EOF, or an error that ends the stream
  close_fd(replica.pipe_fds[stream]);
}

void Attempt::check_deadlines() {
  const auto now = Clock::now();
  if (reason_ == StopReason::kNone && now >= job_.deadline) {
    reason_ = StopReason::kTimeout;
    tell_peers(LocalFailureKind::kTimedOut, kExitTimeout,
               fmt::format("timed out (--timeout {:.3g} s)", job_.options->timeout.count() / 1000.0));
    job_.mux->message(fmt::format("job timeout expired; stopping {} replica(s)", running()));
    // What each one was doing (a stopped or stuck replica is named by its state), before the
    // stop changes it; no stacks: a timeout is not known to be a hang.
    report_calls("--timeout expired", /*failing=*/false);
    stop_all(SIGTERM);
  }
  if (kill_deadline_ && now >= *kill_deadline_) kill_all();
}

// How long a replica must have waited for one that ended without joining before the job is
// stopped: the ended one's own child (a wrapper script's program) may still be joining.
constexpr double kDepartedWaitS = 1.0;

void Attempt::check_monitor() {
  if (reason_ != StopReason::kNone || job_.options->monitor == nullptr) return;
  const auto now = Clock::now();
  if (now < next_monitor_check_) return;
  next_monitor_check_ = now + std::chrono::milliseconds(kMonitorIntervalMs);
  std::vector<pid_t> pids;
  for (const Replica& r : replicas_) pids.push_back(r.pid);
  std::optional<std::string> bad = job_.options->monitor->check(pids);
  // A replica that ended (code 0) without ever joining the job cannot come to a collective:
  // whoever waits for it would wait out the collective timeout (a minute by default).
  if (!bad && !ended_.empty()) {
    if (auto waited = job_.options->monitor->waits_for_departed(pids, ended_, kDepartedWaitS,
                                                                job_.placement.first_ordinal)) {
      bad = fmt::format("ordinal {} exited with code 0 without joining the job, and {} for it "
                        "(every replica must make the same collective calls)",
                        global(waited->first), waited->second);
    }
  }
  if (!bad) return;
  reason_ = StopReason::kMonitor;
  finding_ = std::move(*bad);
  tell_peers(LocalFailureKind::kLauncherError, kExitLauncherError, finding_);
  job_.mux->message(fmt::format("{}; stopping {} replica(s) (SIGTERM, SIGKILL after {} ms)",
                                finding_, running(), job_.options->grace.count()));
  stop_all(SIGTERM);
}

void Attempt::stop_all(int signo) {
  for (Replica& r : replicas_) {
    if (r.reaped) continue;
    signal_replica(r.pid, signo);
    // A stopped replica (SIGSTOP, a stop of its own) takes the signal only once continued: it
    // would wait out the grace period for SIGKILL instead of cleaning up.
    signal_replica(r.pid, SIGCONT);
    r.signalled = true;
  }
  if (!stopping_since_) stopping_since_ = Clock::now();
  if (!kill_deadline_) kill_deadline_ = Clock::now() + job_.options->grace;
}

void Attempt::kill_all() {
  for (Replica& r : replicas_) {
    if (r.reaped) continue;
    signal_replica(r.pid, SIGKILL);
    r.signalled = true;
    r.killed = true;
  }
  kill_deadline_.reset();
}

int Attempt::running() const {
  int n = 0;
  for (const Replica& r : replicas_) n += r.reaped ? 0 : 1;
  return n;
}

bool Attempt::done() const {
  if (running() > 0) return false;
  if (drain_deadline_ && Clock::now() >= *drain_deadline_) return true;
  for (const Replica& r : replicas_) {
    if (r.pipe_fds[0] >= 0 || r.pipe_fds[1] >= 0) return false;
  }
  return true;
}

AttemptResult Attempt::result() const {
  AttemptResult result;
  switch (reason_) {
    case StopReason::kNone:
      return result;
    case StopReason::kFailure:
      result.outcome = JobOutcome::kFailed;
      result.failed_ordinal = root_;
      result.exit_code = exit_code_for_status(replicas_[static_cast<size_t>(*root_)].status);
      break;
    case StopReason::kMonitor:
      result.outcome = JobOutcome::kFailed;
      result.exit_code = kExitLauncherError;
      break;
    case StopReason::kTimeout:
      result.outcome = JobOutcome::kTimedOut;
      result.exit_code = kExitTimeout;
      break;
    case StopReason::kSignal:
      result.outcome = JobOutcome::kInterrupted;
      result.exit_code = 128 + stop_signal_;
      break;
    case StopReason::kPeers:
      result.outcome = JobOutcome::kFailed;
      result.exit_code = kExitLauncherError;  // the job's verdict replaces it
      break;
  }
  // Interrupted while stopping for another reason: that reason stays the summary and the
  // status, but the attempt is not restarted.
  if (interrupted_ && result.outcome == JobOutcome::kFailed) result.outcome = JobOutcome::kInterrupted;
  result.summary = report();
  result.details = details();
  if (peer_stop_ && peer_stop_->job_over) {
    result.job_over = true;
    result.outcome = JobOutcome::kFailed;
    result.exit_code = peer_stop_->exit_code;
    result.summary = peer_stop_->summary + others_report();
  }
  return result;
}

std::string Attempt::report() const {
  return headline() + details();
}

std::string Attempt::details() const {
  std::string text = others_report();
  if (reason_ != StopReason::kMonitor && !finding_.empty()) {
    text += fmt::format("xla-spawn: also found: {}\n", finding_);
  }
  return text;
}

std::string Attempt::headline() const {
  // Until the attempt began to stop, not until its last replica was reaped (the grace period).
  const double elapsed_s =
      std::chrono::duration<double>(stopping_since_.value_or(Clock::now()) - started_).count();
  if (reason_ == StopReason::kTimeout) {
    const double timeout_s = job_.options->timeout.count() / 1000.0;
    if (attempt_ == 0) {
      return fmt::format("xla-spawn: job {} timed out (--timeout {:.3g} s) after {:.2f} s; exit {}\n",
                         job_.job_id, timeout_s, elapsed_s, kExitTimeout);
    }
    // The timeout covers the whole job, its restarts included.
    return fmt::format(
        "xla-spawn: job {} timed out (--timeout {:.3g} s, the whole job) during attempt {}, "
        "{:.2f} s into it; exit {}\n",
        job_.job_id, timeout_s, attempt_, elapsed_s, kExitTimeout);
  }
  if (reason_ == StopReason::kMonitor) {
    return fmt::format("xla-spawn: job {} attempt {} failed after {:.2f} s: {}\n", job_.job_id,
                       attempt_, elapsed_s, finding_);
  }
  if (reason_ == StopReason::kPeers) {
    return fmt::format("xla-spawn: job {} attempt {} stopped on node {} after {:.2f} s: {}\n",
                       job_.job_id, attempt_, job_.placement.node, elapsed_s, peer_stop_->reason);
  }
  if (reason_ != StopReason::kFailure) {
    return fmt::format("xla-spawn: job {} interrupted by {} after {:.2f} s\n", job_.job_id,
                       signal_name(stop_signal_), elapsed_s);
  }
  const Replica& root = replicas_[static_cast<size_t>(*root_)];
  const int ordinal = global(root.ordinal);
  std::string text =
      fmt::format("xla-spawn: job {} attempt {} failed after {:.2f} s: ordinal {} {}\n",
                  job_.job_id, attempt_, elapsed_s, ordinal, describe(root));
  const auto& tail = job_.mux->tail(root.ordinal);
  if (tail.empty()) return text + fmt::format("xla-spawn: ordinal {} printed nothing\n", ordinal);
  text += fmt::format("xla-spawn: last {} line(s) of ordinal {}:\n", tail.size(), ordinal);
  for (const std::string& line : tail) text += fmt::format("  [{}] {}\n", ordinal, line);
  return text;
}

// Every replica but the root cause: stopped by us (not a failure), failed by itself before
// we stopped it, or completed.
std::string Attempt::others_report() const {
  std::vector<int> stopped, killed, completed, also_failed;
  for (const Replica& r : replicas_) {
    if (root_ && r.ordinal == *root_) continue;
    const int ordinal = global(r.ordinal);
    if (r.signalled) {
      stopped.push_back(ordinal);
      if (r.killed) killed.push_back(ordinal);
    } else {
      (is_failure(r.status) ? also_failed : completed).push_back(ordinal);
    }
  }
  std::string text;
  if (!stopped.empty()) {
    text += fmt::format(
        "xla-spawn: stopped by xla-spawn (not failures): ordinal(s) {}{}\n",
        format_int_ranges(stopped),
        killed.empty() ? "" : fmt::format("; SIGKILL needed for {}", format_int_ranges(killed)));
  }
  if (!also_failed.empty()) {
    text += fmt::format("xla-spawn: also failed on their own: ordinal(s) {}\n",
                        format_int_ranges(also_failed));
  }
  if (!completed.empty()) {
    text += fmt::format("xla-spawn: completed: ordinal(s) {}\n", format_int_ranges(completed));
  }
  return text;
}

}  // namespace xs::detail
