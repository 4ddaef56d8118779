#include "xla_spawn/launcher/supervisor.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/base/io.h"
#include "xla_spawn/base/trace.h"
#include "xla_spawn/cluster/connection.h"
#include "xla_spawn/launcher/detail/attempt.h"
#include "xla_spawn/launcher/exit_report.h"
#include "xla_spawn/launcher/orphans.h"
#include "xla_spawn/launcher/replica_env.h"
#include "xla_spawn/launcher/signal_pipe.h"
#include "xla_spawn/replica/context.h"

namespace xs {
namespace {

// Calls JobResources::release() when an attempt ends by any path, exceptions included.
class ReleaseGuard {
 public:
  explicit ReleaseGuard(JobResources* resources) : resources_(resources) {}
  ~ReleaseGuard() {
    if (resources_ != nullptr) resources_->release();
  }
  ReleaseGuard(const ReleaseGuard&) = delete;
  ReleaseGuard& operator=(const ReleaseGuard&) = delete;

 private:
  JobResources* resources_;
};

void validate(int nprocs, const SupervisorOptions& options) {
  XS_CHECK_ARG(nprocs >= 1 && nprocs <= kMaxLocalWorldSize, "nprocs {}: expected 1..{}", nprocs,
               kMaxLocalWorldSize);
  XS_CHECK_ARG(options.grace.count() >= 0, "grace period {} ms must not be negative",
               options.grace.count());
  XS_CHECK_ARG(options.timeout.count() >= 0, "timeout {} ms must not be negative (0: none)",
               options.timeout.count());
  XS_CHECK_ARG(options.max_restarts >= 0, "max_restarts {} must not be negative",
               options.max_restarts);
  if (options.trace_file) trace::check_file(*options.trace_file, "--trace");
}

// After an attempt (and at the end of the job, when the parts go), the replicas' spans merged
// into one file; a failure to write it is reported, not fatal: the job's outcome stands.
void merge_trace(const detail::JobContext& job, bool last) {
  if (job.trace_file.empty()) return;
  if (trace::count_parts(job.trace_file, job.job_id) == 0) {
    // An empty file reported as a trace would pass for one; whatever is at FILE stays.
    if (last) {
      job.mux->message(fmt::format("no trace written to {}: no replica wrote a part (only a "
                                   "replica that calls xm::init(), as the trainers and the Python "
                                   "module do, records spans; or the parts were removed during "
                                   "the job)",
                                   job.trace_file));
    }
    return;
  }
  const std::optional<trace::FileStamp> now = trace::stamp(job.trace_file);
  if (job.trace_output == job.trace_file && now && now != job.trace_seen) {
    // Someone wrote FILE meanwhile (another job given the same FILE): what they wrote stays,
    // this job's trace goes beside it. A FILE removed meanwhile protects nothing.
    job.trace_output = trace::tagged_path(job.trace_file, job.job_id);
    job.mux->message(fmt::format("{} changed during this job (another job given the same "
                                 "file?); this job's trace goes to {}",
                                 job.trace_file, job.trace_output));
  }
  try {
    const int node = job.placement.nnodes > 1 ? job.placement.node : -1;
    const size_t spans = trace::merge(job.trace_file, job.job_id, node, /*remove_parts=*/last,
                                      job.trace_output);
    if (job.trace_output == job.trace_file) job.trace_seen = trace::stamp(job.trace_file);
    if (last) job.mux->message(fmt::format("trace of {} span(s) written to {}", spans, job.trace_output));
  } catch (const std::exception& e) {
    job.mux->message(fmt::format("trace not written: {} (the replicas' parts, {}.{}.*.part, are "
                                 "kept)",
                                 e.what(), job.trace_file, job.job_id));
  }
}

// The supervisor holds 3 fds per replica (two pipe ends and a pidfd): for large N, raise
// the soft limit toward the hard one rather than fail with EMFILE half-way through forking.
void ensure_fd_limit(int nprocs) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t needed = 3 * static_cast<rlim_t>(nprocs) + 64;  // 64: stdio, logs, signal pipe
  if (limit.rlim_cur >= needed) return;
  limit.rlim_cur = std::min(needed, limit.rlim_max);
  ::setrlimit(RLIMIT_NOFILE, &limit);
}

// torch.distributed's env:// rendezvous, as torchrun gives it on one host: rank 0 hosts its
// store at MASTER_ADDR:MASTER_PORT, a loopback port free when the attempt starts, unless the
// user set them. Without a usable loopback (a network namespace whose lo is down) the port is
// left out; only such programs need it, and they then say which variable is missing.
std::vector<EnvVar> torch_master_env() {
  return torch_store_env("127.0.0.1", []() -> std::optional<uint16_t> {
    try {
      return cluster::pick_free_port("127.0.0.1");
    } catch (const IoError&) {
      return std::nullopt;
    }
  });
}

detail::AttemptResult run_attempt(const detail::JobContext& job, int attempt,
                                  JobResources* resources) {
  ReleaseGuard guard(resources);
  const Placement& p = job.placement;
  std::vector<EnvVar> extra =
      resources != nullptr
          ? resources->prepare(segment_key(job.job_id, p.node, p.nnodes), job.nprocs, attempt)
          : std::vector<EnvVar>();
  const std::vector<EnvVar> more = job.options->peers != nullptr ? job.options->peers->env() : torch_master_env();
  extra.insert(extra.end(), more.begin(), more.end());
  if (!job.trace_file.empty()) {
    extra.push_back({trace::kFileEnv, job.trace_file});
    extra.push_back({trace::kT0Env, std::to_string(job.trace_t0_ns)});
  } else {  // one inherited from a tracing launcher around this one is not this job's
    extra.push_back({trace::kFileEnv, std::nullopt});
    extra.push_back({trace::kT0Env, std::nullopt});
  }
  job.mux->begin_attempt(attempt);
  detail::Attempt run(job, attempt);
  return run.run(extra);
}

// While this node waits for the job's verdict its replicas have ended, but the job may run
// on elsewhere for long (a node with more work, or a slower one). An interrupt then is this
// node's failure: the master stops the attempt on every node, and the job ends with 128 +
// the signal, not restarted. A second one (not the first delivered twice) leaves at once,
// without the verdict, with this node's own failure's status if it had one
// (`own_summary`), else 128 + the signal. An interrupt the master heard too late (it had
// decided to restart) is passed on to the next attempt, which it stops at once.
PeerVerdict wait_for_verdict(const detail::JobContext& job, int attempt, int exit_code,
                             const std::string& own_summary, JobPeers& peers) {
  int first = 0;
  detail::Clock::time_point first_at;
  const auto on_signal = [&]() -> std::optional<PeerVerdict> {
    for (const int signo : job.signals->drain()) {
      if (signo == SIGUSR1 || signo == SIGTSTP) {
        job.mux->message(fmt::format("received {}: no replica runs on this node, which waits for "
                                     "the other nodes to end attempt {}",
                                     signal_name(signo), attempt));
        continue;
      }
      if (first == 0) {
        first = signo;
        first_at = detail::Clock::now();
        peers.local_failure({-1, LocalFailureKind::kInterrupted, 128 + signo,
                             fmt::format("was interrupted by {} while waiting for the other nodes",
                                         signal_name(signo)),
                             {}});
        job.mux->message(fmt::format("received {} while waiting for the other nodes; stopping "
                                     "the job on every node (again: leave now)",
                                     signal_name(signo)));
      } else if (signo != first || detail::Clock::now() - first_at >= detail::kRepeatWindow) {
        const std::string again =
            signo == first ? std::string(" again") : fmt::format(" after {}", signal_name(first));
        return PeerVerdict{false, attempt, exit_code != 0 ? exit_code : 128 + first,
                           fmt::format("xla-spawn: received {}{}; left without the job's "
                                       "verdict\n{}",
                                       signal_name(signo), again, exit_code != 0 ? own_summary : "")};
      }
    }
    return std::nullopt;
  };
  const PeerVerdict verdict = peers.end_attempt(attempt, exit_code, job.signals->read_fd(), on_signal);
  if (verdict.restart && first != 0) {
    job.mux->message(fmt::format("the job had decided to restart before it heard of the {}; it "
                                 "stops the next attempt",
                                 signal_name(first)));
    job.signals->replay(first);
  }
  return verdict;
}

// One node's end of a multi-node attempt: the job decides (restart, or end with the root
// cause's status and summary, which every node prints); this node's own view of its replicas
// follows the job's summary.
bool settle_with_peers(const detail::JobContext& job, const detail::AttemptResult& a, int attempt,
                       JobPeers& peers, JobResult& result) {
  const OutputMux& mux = *job.mux;
  PeerVerdict verdict;
  if (a.job_over) {
    verdict.exit_code = a.exit_code;
    verdict.summary = a.summary;
  } else {
    verdict = wait_for_verdict(job, attempt,
                               a.outcome == JobOutcome::kSucceeded ? 0 : std::max(1, a.exit_code),
                               a.summary, peers);
    if (!verdict.restart && verdict.exit_code != 0) verdict.summary += a.details;
  }
  if (verdict.restart) {
    if (!a.summary.empty()) mux.report(a.summary);
    if (!verdict.summary.empty()) mux.report(verdict.summary);  // the job's root cause
    result.attempts = verdict.attempt;
    return false;
  }
  result.outcome = verdict.exit_code == 0 ? JobOutcome::kSucceeded : JobOutcome::kFailed;
  result.exit_code = verdict.exit_code;
  result.summary = verdict.summary;
  if (!result.summary.empty()) mux.report(result.summary);
  return true;
}

}  // namespace

JobResult supervise(int nprocs, const ReplicaBody& body, const SupervisorOptions& options) {
  validate(nprocs, options);
  ensure_fd_limit(nprocs);
  SignalPipe signals;
  detail::JobContext job;
  job.nprocs = nprocs;
  job.placement = options.peers != nullptr
                      ? options.peers->placement()
                      : Placement{make_job_id(), 0, 1, 0, nprocs};
  job.job_id = job.placement.job_id;
  OutputOptions output = options.output;
  output.first_ordinal = job.placement.first_ordinal;
  OutputMux mux(output, nprocs);
  job.body = &body;
  job.options = &options;
  job.mux = &mux;
  job.signals = &signals;
  if (options.timeout.count() > 0) job.deadline = detail::Clock::now() + options.timeout;
  if (options.trace_file) {
    job.trace_file = std::filesystem::absolute(*options.trace_file).lexically_normal().string();
    // Each node writes its own file: on a filesystem the nodes share, one name would be
    // written by all of them, and each merge would take the others' parts.
    if (job.placement.nnodes > 1) {
      job.trace_file = trace::tagged_path(job.trace_file, fmt::format("node{}", job.placement.node));
    }
    job.trace_output = job.trace_file;
    job.trace_seen = trace::stamp(job.trace_file);
    job.trace_t0_ns = trace::now_ns();
  }

  JobResult result;
  result.job_id = job.job_id;
  const auto finish = [&job](const JobResult& r) {
    merge_trace(job, /*last=*/true);
    // Written or not, nothing is left for the reaper to merge should this process be killed.
    if (job.options->observer != nullptr) job.options->observer->trace_merged();
    return r;
  };
  for (int attempt = 0;;) {
    const detail::AttemptResult a = run_attempt(job, attempt, options.resources);
    if (options.helper_pids) kill_orphans(options.helper_pids());
    result.outcome = a.outcome;
    result.exit_code = a.exit_code;
    result.failed_ordinal = a.failed_ordinal;
    result.summary = a.summary;
    result.attempts = attempt + 1;
    if (options.peers != nullptr) {
      if (settle_with_peers(job, a, attempt, *options.peers, result)) return finish(result);
      attempt = result.attempts;
      merge_trace(job, /*last=*/false);  // what the failed attempt recorded, should this be the end
      // Node 0's --max-restarts decides (NodeSession warns when this node's differs).
      mux.message(fmt::format("restarting all replicas of the job on every node: attempt {}",
                              attempt));
      continue;
    }
    if (a.outcome == JobOutcome::kSucceeded) return finish(result);
    mux.report(a.summary);
    if (a.outcome != JobOutcome::kFailed || attempt >= options.max_restarts) return finish(result);
    ++attempt;
    merge_trace(job, /*last=*/false);  // what the failed attempt recorded, should this be the end
    mux.message(fmt::format("restarting all {} replica(s): attempt {} of at most {}", nprocs,
                            attempt, options.max_restarts + 1));
  }
}

}  // namespace xs
