#include "launcher/supervisor.h"

#include <sys/resource.h>

#include <algorithm>

#include <fmt/format.h>

#include "base/check.h"
#include "launcher/detail/attempt.h"
#include "launcher/signal_pipe.h"
#include "replica/context.h"

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
  XS_CHECK_ARG(nprocs >= 1 && nprocs <= kMaxWorldSize, "nprocs {}: expected 1..{}", nprocs,
               kMaxWorldSize);
  XS_CHECK_ARG(options.grace.count() >= 0, "grace period {} ms must not be negative",
               options.grace.count());
  XS_CHECK_ARG(options.timeout.count() >= 0, "timeout {} ms must not be negative (0: none)",
               options.timeout.count());
  XS_CHECK_ARG(options.max_restarts >= 0, "max_restarts {} must not be negative",
               options.max_restarts);
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

detail::AttemptResult run_attempt(const detail::JobContext& job, int attempt,
                                  JobResources* resources) {
  ReleaseGuard guard(resources);
  const std::vector<EnvVar> extra = resources != nullptr
                                        ? resources->prepare(job.job_id, job.nprocs, attempt)
                                        : std::vector<EnvVar>();
  job.mux->begin_attempt(attempt);
  detail::Attempt run(job, attempt);
  return run.run(extra);
}

}  // namespace

JobResult supervise(int nprocs, const ReplicaBody& body, const SupervisorOptions& options) {
  validate(nprocs, options);
  ensure_fd_limit(nprocs);
  OutputMux mux(options.output, nprocs);
  SignalPipe signals;
  detail::JobContext job;
  job.nprocs = nprocs;
  job.job_id = make_job_id();
  job.body = &body;
  job.options = &options;
  job.mux = &mux;
  job.signals = &signals;
  if (options.timeout.count() > 0) job.deadline = detail::Clock::now() + options.timeout;

  JobResult result;
  result.job_id = job.job_id;
  for (int attempt = 0;; ++attempt) {
    const detail::AttemptResult a = run_attempt(job, attempt, options.resources);
    result.outcome = a.outcome;
    result.exit_code = a.exit_code;
    result.failed_ordinal = a.failed_ordinal;
    result.summary = a.summary;
    result.attempts = attempt + 1;
    if (a.outcome == JobOutcome::kSucceeded) return result;
    mux.report(a.summary);
    if (a.outcome != JobOutcome::kFailed || attempt >= options.max_restarts) return result;
    mux.message(fmt::format("restarting all {} replica(s): attempt {} of at most {}", nprocs,
                            attempt + 1, options.max_restarts + 1));
  }
}

}  // namespace xs
