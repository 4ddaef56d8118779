#pragma once
// The supervisor behind both xla-spawn and spawn(fn): forks N replicas, multiplexes their
// output line-whole, and tears the job down fail-fast. The first replica to exit non-zero
// or die by a signal is the root cause; the others get SIGTERM to their process group and
// SIGKILL after the grace period. SIGINT/SIGTERM/SIGHUP/SIGQUIT received by the supervisor are
// forwarded to every replica (SIGKILL after the grace period; a second signal kills at once).
//
//   xs::SupervisorOptions options;
//   options.grace = std::chrono::seconds(3);
//   xs::JobResult r = xs::supervise(8, [&](int) { execv(path, argv); _exit(127); }, options);
//   return r.exit_code;

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>

#include "xla_spawn/launcher/child_process.h"
#include "xla_spawn/launcher/exit_report.h"
#include "xla_spawn/launcher/job_peers.h"
#include "xla_spawn/launcher/job_resources.h"
#include "xla_spawn/launcher/output_mux.h"

namespace xs {

// Whether ordinal k is pinned to the (k mod n)-th CPU the launcher may run on. kAuto pins
// when 2 <= N <= CPUs, as mpirun binds small jobs to cores: two replicas that spin in a
// collective and land on one core were measured at 2 ms per 8-byte all-reduce instead of
// 0.3 us. A single replica is left free so that two single-replica jobs do not share a core.
enum class CoreBinding { kAuto, kOn, kOff };

// Told about each replica process as it is forked and once it is reaped (its pid is also its
// process group). The reaper (launcher/reaper.h) uses it to clean up after a killed launcher.
class ReplicaObserver {
 public:
  virtual ~ReplicaObserver() = default;
  // The variables every replica of the attempt gets (job id, node, trace file, ...), before
  // its first replica starts.
  virtual void job_environment(const std::vector<EnvVar>& /*env*/) noexcept {}
  virtual void replica_started(pid_t pid) noexcept = 0;
  virtual void replica_reaped(pid_t pid) noexcept = 0;
  // The job's last trace merge is done, written or not: nothing is left to merge.
  virtual void trace_merged() noexcept {}
};

// Asked every kMonitorIntervalMs while an attempt runs whether the job is still sound; a
// message stops the attempt as failed (SIGTERM, SIGKILL after the grace) and is its summary.
// launcher/segment_monitor.h validates the segment's control block this way.
class JobMonitor {
 public:
  virtual ~JobMonitor() = default;
  // pids_by_ordinal[k] is ordinal k's replica process.
  virtual std::optional<std::string> check(std::span<const pid_t> pids_by_ordinal) noexcept = 0;
  // The hang report's lines (shm/call_report.h; ordinals offset by first_ordinal; spans_nodes
  // in a multi-node job), empty when there is nothing to read.
  virtual std::string call_report(std::span<const pid_t> /*pids_by_ordinal*/,
                                  int /*first_ordinal*/, bool /*spans_nodes*/) noexcept {
    return {};
  }
  // The straggler line (shm/call_report.h's straggler_line), empty when no ordinal was
  // markedly the last to arrive at collectives; read when an attempt's replicas have ended.
  virtual std::string straggler_report(int /*first_ordinal*/, bool /*spans_nodes*/) noexcept {
    return {};
  }
  // Whether the job's segment was poisoned by a collective that timed out.
  virtual bool timed_out() noexcept { return false; }
  // The longest any replica has now been inside one collective call (or one multi-node
  // call's transfers between nodes) that has not returned, in seconds; 0 when none is.
  virtual double longest_wait_s() noexcept { return 0; }
  // Whether a replica has waited at least `min_wait_s` inside a collective for one of the
  // local ordinals `ended`, replicas that exited (code 0), of which one never joined the job
  // (so cannot come): that ordinal and who waits, "ordinal 0 has waited 1.2 s in all_reduce"
  // (ordinals offset by first_ordinal). Nothing for ended replicas that did join: their peers
  // see them gone by themselves.
  virtual std::optional<std::pair<int, std::string>> waits_for_departed(
      std::span<const pid_t> /*pids_by_ordinal*/, std::span<const int> /*ended*/,
      double /*min_wait_s*/, int /*first_ordinal*/) noexcept {
    return std::nullopt;
  }
  // Asks every replica that can (shm/stack_dump.h) for its main thread's stack, on stderr;
  // a stopped one only with `continue_stopped` (it is sent SIGCONT after the request, and
  // prints where it was stopped). Returns how many were asked.
  virtual int request_stacks(std::span<const pid_t> /*pids_by_ordinal*/,
                             bool /*continue_stopped*/) noexcept {
    return 0;
  }
};
// 200 ms: a scribbled segment is caught well within a collective timeout, at ~1 us a check.
inline constexpr int kMonitorIntervalMs = 200;

struct SupervisorOptions {
  OutputOptions output;
  std::chrono::milliseconds grace{3000};        // SIGTERM -> SIGKILL
  std::chrono::milliseconds timeout{0};         // whole job, all attempts; 0: no limit
  int max_restarts = 0;                         // restarts of the whole group after a failure
  CoreBinding bind_cores = CoreBinding::kAuto;  // see CoreBinding
  JobResources* resources = nullptr;            // not owned; see job_resources.h
  ReplicaObserver* observer = nullptr;          // not owned; may be null
  JobMonitor* monitor = nullptr;                // not owned; may be null
  // The other nodes of a multi-node job (not owned; null on a single node): where this node's
  // replicas sit, job-wide stops, restarts and the end of the job come from there.
  JobPeers* peers = nullptr;
  // Set when this process is its replicas' subreaper (launcher/orphans.h): the pids of its own
  // helper children, which are spared when the orphans are killed after each attempt.
  std::function<std::set<pid_t>()> helper_pids;
  // Set when every replica is a program (the CLI): replicas are started with spawn_replica
  // (launcher/child_process.h), cheaper than forking for the ReplicaBody, which is then unused.
  const ExecCommand* exec = nullptr;  // not owned
  // --trace FILE: the replicas record a timeline (base/trace.h) and the supervisor merges it
  // into FILE after every attempt. Checked before anything starts (its directory must exist).
  std::optional<std::string> trace_file;
};

struct JobResult {
  JobOutcome outcome = JobOutcome::kSucceeded;
  int exit_code = 0;                  // what xla-spawn exits with (exit_report.h)
  std::optional<int> failed_ordinal;  // the root cause of the last attempt, if one failed
  int attempts = 0;                   // attempts run (1 + restarts used)
  std::string job_id;
  std::string summary;  // the last attempt's report; empty on success
};

// Runs `nprocs` replicas of `body` (see child_process.h) until all have exited, the job
// fails, times out, or a signal stops it; restarts after a failure up to max_restarts
// times. Writes the failure summary to the console too. Throws xs::InvalidArgument for a
// bad nprocs or options, xs::IoError when fork/pipe/log files fail; in every case no replica
// outlives the call and resources->release() has run.
JobResult supervise(int nprocs, const ReplicaBody& body, const SupervisorOptions& options);

}  // namespace xs
