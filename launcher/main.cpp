// xla-spawn: runs N replicas of a command and supervises them. See options.h for the
// command line, supervisor.h for the behaviour and exit_report.h for the exit codes.
//
//   xla-spawn -n 8 -- ./train --epochs 3

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "xla_spawn/base/io.h"
#include "xla_spawn/launcher/command_path.h"
#include "xla_spawn/launcher/node_session.h"
#include "xla_spawn/launcher/options.h"
#include "xla_spawn/launcher/orphans.h"
#include "xla_spawn/launcher/reaper.h"
#include "xla_spawn/launcher/rendezvous_process.h"
#include "xla_spawn/launcher/replica_env.h"
#include "xla_spawn/launcher/segment_monitor.h"
#include "xla_spawn/launcher/segment_resources.h"
#include "xla_spawn/launcher/signal_pipe.h"
#include "xla_spawn/launcher/supervisor.h"

namespace {

// While a node waits in the rendezvous (before any replica exists), Ctrl-C, SIGTERM, SIGHUP or
// SIGQUIT end xla-spawn as they would by default, but say so first (a SIGHUP ignored under
// nohup stays ignored). The master sees this node's connection close and names it as having
// left. SIGUSR1 (the hang report) asks where the rendezvous stands: the master passes it on
// to its rendezvous server, which knows (and answers at most once a second); another node
// says that it waits, at most once a second too (a flood of signals must not flood the
// console).
class RendezvousInterrupt {
 public:
  explicit RendezvousInterrupt(bool master) {
    g_master = master;
    struct sigaction action {};
    action.sa_handler = &RendezvousInterrupt::on_signal;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      xs::install_unless_nohup(kSignals[i], action, &previous_[i]);
    }
    struct sigaction status {};
    status.sa_handler = &RendezvousInterrupt::on_status;
    sigemptyset(&status.sa_mask);
    status.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &status, &previous_status_);
  }
  ~RendezvousInterrupt() {
    for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
    ::sigaction(SIGUSR1, &previous_status_, nullptr);
  }
  RendezvousInterrupt(const RendezvousInterrupt&) = delete;
  RendezvousInterrupt& operator=(const RendezvousInterrupt&) = delete;

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  static void on_signal(int signal) {  // async-signal-safe: write, then the default death
    static constexpr char kMessage[] =
        "xla-spawn: interrupted during the rendezvous; no replica was started\n";
    [[maybe_unused]] const ssize_t n = ::write(2, kMessage, sizeof kMessage - 1);
    ::signal(signal, SIG_DFL);
    ::raise(signal);
  }
  // Async-signal-safe: atomic loads and stores, clock_gettime, kill, write. The master has
  // no server to ask for a moment as it starts and as it ends: it says nothing then.
  static void on_status(int) {
    const int saved = errno;
    if (const pid_t server = xs::RendezvousProcess::status_target(); server > 0) {
      ::kill(server, SIGUSR1);
    } else if (!g_master) {
      timespec now{};
      ::clock_gettime(CLOCK_MONOTONIC, &now);
      const int64_t now_ns = int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
      const int64_t last = g_last_said_ns.load();
      if (last == 0 || now_ns - last >= 1'000'000'000) {
        g_last_said_ns.store(now_ns);
        static constexpr char kMessage[] =
            "xla-spawn: received SIGUSR1: waiting in the rendezvous for the job to form (node "
            "0's xla-spawn lists the nodes that have come: kill -USR1 it)\n";
        [[maybe_unused]] const ssize_t n = ::write(2, kMessage, sizeof kMessage - 1);
      }
    }
    errno = saved;
  }
  static inline volatile sig_atomic_t g_master = 0;
  static inline std::atomic<int64_t> g_last_said_ns{0};
  static_assert(std::atomic<int64_t>::is_always_lock_free);
  struct sigaction previous_[std::size(kSignals)] = {};
  struct sigaction previous_status_ = {};
};

int run(int argc, const char* const* argv) {
  // The hang report's signal must not end xla-spawn before the supervisor listens for it (a
  // multi-node launcher waits in the rendezvous first); replicas start with it at default.
  ::signal(SIGUSR1, SIG_IGN);
  const xs::CommandLine cl = xs::parse_command_line(argc, argv);
  if (cl.help) {
    xs::write_all(1, xs::usage_text());
    return 0;
  }
  if (cl.version) {
    xs::write_all(1, xs::version_text());
    return 0;
  }
  // Started by spawn_replica; a failed exec (the file changed since resolve_command checked
  // it) exits kExitCommandNotFound naming it.
  const xs::ExecCommand command{xs::resolve_command(cl.command[0]), cl.command};
  xs::check_replica_settings();
  const xs::ReplicaBody unused_body = [](int) { ::_exit(xs::kExitCommandNotFound); };
  // Its settings are checked (and stale segments swept) before a multi-node job forms: a node
  // with a bad setting fails at once instead of after every node has joined.
  xs::SegmentResources segment;
  // A multi-node job forms before anything is started here: a node that cannot join starts
  // no replica.
  std::unique_ptr<xs::NodeSession> session;
  if (cl.nodes.multi_node()) {
    const RendezvousInterrupt interrupt(cl.nodes.node == 0);
    session = xs::NodeSession::join(cl.nodes, cl.nprocs, cl.supervisor.max_restarts, cl.command);
  }
  xs::SupervisorOptions options = cl.supervisor;
  if (session) {
    const xs::Placement& p = session->placement();
    if (!cl.show_ordinals.empty()) {
      options.output.shown =
          xs::resolve_shown_ordinals(cl.show_ordinals, p.first_ordinal, cl.nprocs, p.world_size);
    }
    options.peers = session.get();
  }
  // Forked before any replica, so it holds none of their pipes; removes the segment and kills
  // the replicas' groups if this process dies without doing so (SIGKILL, OOM kill).
  xs::SegmentMonitor monitor(&segment);
  xs::Reaper reaper(&monitor, &monitor);
  options.resources = &reaper;
  options.observer = &reaper;
  options.monitor = &reaper;
  // What a replica leaves outside its process group comes back here when its parent exits, and
  // is killed after the attempt (launcher/orphans.h).
  xs::become_subreaper();
  options.helper_pids = [&] {
    return std::set<pid_t>{reaper.pid(), session ? session->server_pid() : -1};
  };
  options.exec = &command;
  return xs::supervise(cl.nprocs, unused_body, options).exit_code;
}

void fail(const std::string& message) {
  xs::write_all(2, fmt::format("xla-spawn: {}\n", message));
}

}  // namespace

int main(int argc, char** argv) {
  // A closed console must not kill the supervisor (and with it, every replica).
  std::signal(SIGPIPE, SIG_IGN);
  // Started with stdin, stdout or stderr closed (`>&-`), the first pipe or file would take its
  // number, and the replicas' output would be written into it. /dev/null holds the place.
  bool stdout_closed = false;
  for (const int fd : {0, 1, 2}) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    if (::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) != fd) return xs::kExitLauncherError;
    stdout_closed = stdout_closed || fd == 1;
  }
  if (stdout_closed) {
    xs::write_all(2, "xla-spawn: stdout is closed: the replicas' stdout lines are dropped "
                     "(--log-dir keeps them)\n");
  }
  try {
    return run(argc, argv);
  } catch (const xs::UsageError& e) {
    fail(e.show_usage() ? fmt::format("{}\n\n{}", e.what(), xs::usage_text())
                        : fmt::format("{} (see xla-spawn --help)", e.what()));
    return xs::kExitUsage;
  } catch (const xs::CommandNotFound& e) {
    fail(e.what());
    return xs::kExitCommandNotFound;
  } catch (const xs::InvalidArgument& e) {
    fail(e.what());
    return xs::kExitUsage;
  } catch (const xs::PeerFailure& e) {
    // A multi-node job that could not form: the master's refusal or its summary, as is.
    const std::string what = e.what();
    xs::write_all(2, what.rfind("xla-spawn", 0) == 0 ? what : fmt::format("xla-spawn: {}\n", what));
    return xs::kExitLauncherError;
  } catch (const std::exception& e) {
    fail(fmt::format("error: {}", e.what()));
    return xs::kExitLauncherError;
  }
}
