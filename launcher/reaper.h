#pragma once
// A small process xla-spawn forks at start that cleans up after it when it dies by any
// means, SIGKILL included: it reads what to clean from a pipe, and EOF on that pipe (the
// launcher's death, or its normal exit) makes it SIGKILL the replica process groups and
// remove the segments the launcher had not released yet, then exit. It ignores SIGINT,
// SIGTERM, SIGHUP and SIGQUIT (a Ctrl-C reaches the whole foreground group).
//
// A reaper killed on its own is noticed at the next monitor check (every kMonitorIntervalMs)
// and replaced, with a warning; the new one learns what is tracked.
//
//   xs::Reaper reaper(&segment, &monitor);       // forks; wraps the job's resources and monitor
//   options.resources = &reaper;  options.observer = &reaper;  options.monitor = &reaper;
//   xs::supervise(n, body, options);             // ~Reaper: closes the pipe, reaps it

#include <sys/types.h>

#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "xla_spawn/launcher/job_resources.h"
#include "xla_spawn/launcher/supervisor.h"

namespace xs {

class Reaper final : public JobResources, public ReplicaObserver, public JobMonitor {
 public:
  // Forks the reaper. `inner` (not owned, may be null) does the real work of prepare() and
  // release(); the reaper only learns the segment name (XLA_SPAWN_SEGMENT) it returns.
  // check() replaces a dead reaper, then asks `monitor` (not owned, may be null).
  // Throws xs::IoError when pipe or fork fails.
  explicit Reaper(JobResources* inner, JobMonitor* monitor = nullptr);
  // Closes the pipe and waits (at most kExitWaitMs) for the reaper to exit.
  ~Reaper() override;
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;

  std::vector<EnvVar> prepare(const std::string& job_id, int world_size, int attempt) override;
  void release() noexcept override;
  void job_environment(const std::vector<EnvVar>& env) noexcept override;
  void replica_started(pid_t pid) noexcept override;
  void replica_reaped(pid_t pid) noexcept override;
  void trace_merged() noexcept override;
  std::optional<std::string> check(std::span<const pid_t> pids_by_ordinal) noexcept override;
  std::string call_report(std::span<const pid_t> pids_by_ordinal, int first_ordinal,
                          bool spans_nodes) noexcept override {
    return monitor_ != nullptr ? monitor_->call_report(pids_by_ordinal, first_ordinal, spans_nodes)
                               : "";
  }
  std::string straggler_report(int first_ordinal, bool spans_nodes) noexcept override {
    return monitor_ != nullptr ? monitor_->straggler_report(first_ordinal, spans_nodes) : "";
  }
  bool timed_out() noexcept override { return monitor_ != nullptr && monitor_->timed_out(); }
  double longest_wait_s() noexcept override {
    return monitor_ != nullptr ? monitor_->longest_wait_s() : 0;
  }
  std::optional<std::pair<int, std::string>> waits_for_departed(
      std::span<const pid_t> pids_by_ordinal, std::span<const int> ended, double min_wait_s,
      int first_ordinal) noexcept override {
    if (monitor_ == nullptr) return std::nullopt;
    return monitor_->waits_for_departed(pids_by_ordinal, ended, min_wait_s, first_ordinal);
  }
  int request_stacks(std::span<const pid_t> pids_by_ordinal, bool continue_stopped) noexcept override {
    return monitor_ != nullptr ? monitor_->request_stacks(pids_by_ordinal, continue_stopped) : 0;
  }

  pid_t pid() const { return pid_; }

  // How long the destructor waits for the reaper: it only has to read EOF and exit.
  static constexpr int kExitWaitMs = 5000;

 private:
  void start();
  void restart_if_gone() noexcept;
  void send(char op, char kind, const std::string& value) noexcept;

  JobResources* inner_;
  JobMonitor* monitor_;
  std::set<pid_t> groups_;  // replica process groups started and not yet reaped
  std::map<std::string, std::string> mark_;  // what job_environment() sent ("+m NAME=VALUE")
  pid_t pid_ = -1;
  int write_fd_ = -1;  // -1 when the reaper is gone (EPIPE): cleanup falls back to the sweep
  std::string segment_;
};

}  // namespace xs
