#pragma once
// One attempt of a job: fork every replica, run the poll() loop (output pipes, pidfds of
// the replicas, the signal pipe, deadlines) until all are reaped, and say how it ended.
// Private to the supervisor; --max-restarts runs several attempts of one job.
//
//   detail::Attempt attempt(context, /*attempt=*/0);
//   detail::AttemptResult r = attempt.run(extra_env);

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "xla_spawn/base/trace.h"
#include "xla_spawn/launcher/oom_watch.h"
#include "xla_spawn/launcher/signal_pipe.h"
#include "xla_spawn/launcher/supervisor.h"

namespace xs::detail {

using Clock = std::chrono::steady_clock;

// What every attempt of a job shares.
struct JobContext {
  int nprocs = 0;
  std::string job_id;
  Placement placement;  // one node: ordinals 0..nprocs-1 of nprocs
  const ReplicaBody* body = nullptr;
  const SupervisorOptions* options = nullptr;
  OutputMux* mux = nullptr;
  SignalPipe* signals = nullptr;
  Clock::time_point deadline = Clock::time_point::max();  // --timeout, whole job
  // --trace: the merged file (absolute) and time 0 of every replica's spans (CLOCK_MONOTONIC).
  std::string trace_file;
  int64_t trace_t0_ns = 0;
  // What was at trace_file when the job began, then what this job's merges wrote there: a
  // file that differs was written by someone else (another job given the same --trace).
  mutable std::optional<trace::FileStamp> trace_seen;
  mutable std::string trace_output;  // where the merges write: trace_file, unless diverted
};

struct AttemptResult {
  JobOutcome outcome = JobOutcome::kSucceeded;
  int exit_code = 0;
  std::optional<int> failed_ordinal;
  std::string summary;  // empty on success
  // The summary without its headline: what became of this node's other replicas (a
  // multi-node job prints it below the job's own summary).
  std::string details;
  // A multi-node job ended during the attempt (its master was lost): exit_code and summary
  // are the job's, and there is nothing left to ask the other nodes.
  bool job_over = false;
};

// The same signal twice this close is one interrupt delivered twice, not a second one: a
// wrapper that passes signals on (xla_spawn.spawn, `timeout`) while the terminal or a group
// kill reached this process too. A person's second Ctrl-C comes later.
inline constexpr auto kRepeatWindow = std::chrono::milliseconds(500);

class Attempt {
 public:
  Attempt(const JobContext& job, int attempt);
  // On the exception path: SIGKILL and reap whatever still runs; always closes the fds.
  ~Attempt();
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

  AttemptResult run(const std::vector<EnvVar>& extra_env);

 private:
  // kMonitor: the JobMonitor found the job unsound (a scribbled segment, a replica waiting for
  // one that ended without joining).
  enum class StopReason { kNone, kFailure, kTimeout, kSignal, kMonitor, kPeers };
  struct Replica {
    int ordinal = 0;
    pid_t pid = -1;
    int pidfd = -1;
    int pipe_fds[2] = {-1, -1};  // read ends of stdout, stderr; -1 after EOF
    bool reaped = false;
    int status = 0;          // waitpid() status once reaped
    bool signalled = false;  // we sent it a stop signal while it ran
    bool killed = false;     // ...and SIGKILL
    std::optional<std::string> oom;  // who else sent the SIGKILL it died of (OomWatch)
  };

  void start(const std::vector<EnvVar>& extra_env);
  void start_one(Replica& replica, const std::vector<EnvVar>& extra_env,
                 const std::vector<int>& cpus);
  void poll_once();
  void handle_signals();
  void suspend();  // SIGTSTP: the replicas stop with xla-spawn and continue with it
  // This node's first SIGINT, SIGTERM, SIGHUP or SIGQUIT: remembered (the next one kills; the
  // job is not restarted) and told to the other nodes.
  void note_interrupt(int signo);
  void report_calls(const std::string& why, bool failing);  // the hang report, to stderr
  // Reads the replicas' pipes (only) until done() or kStackWait passed.
  void read_output_until(const std::function<bool()>& done);
  static constexpr std::chrono::milliseconds kStackWait{3000};
  bool reap(Replica& replica);  // true when it had exited and is now reaped
  std::string describe(const Replica& replica) const;  // its status, and the OOM killer's part
  void on_failure(const Replica& replica);
  void reap_the_dying(std::vector<Replica*>& failed);
  static Replica& root_cause(const std::vector<Replica*>& failed);
  void read_pipe(Replica& replica, int stream);
  void check_deadlines();
  void check_monitor();
  void check_peers();
  void tell_peers(const Replica& replica);
  void tell_peers(LocalFailureKind kind, int exit_code, const std::string& description);
  int global(int local_ordinal) const { return job_.placement.first_ordinal + local_ordinal; }
  void stop_all(int signo);
  void kill_all();
  bool done() const;
  int running() const;
  AttemptResult result() const;
  std::string report() const;  // headline() + details()
  std::string details() const;
  std::string headline() const;
  std::string others_report() const;
  int timeout_ms_until_next_deadline() const;

  const JobContext& job_;
  const int attempt_;
  std::vector<Replica> replicas_;
  StopReason reason_ = StopReason::kNone;
  std::optional<int> root_;                          // ordinal of the root cause
  int stop_signal_ = 0;                              // this node's interrupt (kSignal)
  Clock::time_point stop_signal_at_{};              // when it was handled
  bool interrupted_ = false;  // an interrupting signal was handled (the next kills)
  std::optional<Clock::time_point> stopping_since_;  // the first stop_all
  std::optional<Clock::time_point> kill_deadline_;   // SIGKILL the rest when reached
  std::optional<Clock::time_point> drain_deadline_;  // all reaped: stop waiting for pipe EOF
  Clock::time_point started_;
  Clock::time_point next_monitor_check_{};
  std::string finding_;     // JobMonitor's message (kMonitor)
  std::vector<int> ended_;  // ordinals that exited with code 0 while the attempt ran
  OomWatch oom_;            // the OOM kill counters as this attempt started
  std::optional<PeerStop> peer_stop_;  // what the other nodes said (kPeers)
  bool hang_reported_ = false;  // a collective timed out and its hang report was printed
};

}  // namespace xs::detail
