#pragma once
// A node's link to its job's rendezvous server, held by that node's xla-spawn: it registers
// the node, receives the world once every node has, exchanges heartbeats, reports this
// node's failures and the end of each attempt, and hears the job's orders: Stop (a failure
// elsewhere: stop the replicas), Next (restart as attempt k) and End (exit with this status).
// A master that closes the connection or falls silent for the heartbeat timeout is reported
// as an End with kJobFailedExitCode, so every caller treats "the master is gone" like an order.
// Silent for two heartbeat intervals, the link asks the master over new connections whether
// it still counts this node (cluster/liveness_probe.h): a network outage shorter than the
// timeout is ridden out even while TCP's retransmissions on the old connection back off.
//
//   xs::cluster::NodeLink link(addr, port, token, options);
//   const xs::cluster::World world = link.join(deadline);   // throws if the job cannot form
//   // in the supervisor's poll loop, when fd() is readable or service_deadline() has passed:
//   for (const xs::cluster::JobOrder& order : link.service()) ...
//   link.report_failure(failed);
//   xs::cluster::JobOrder next = link.finish_attempt(attempt, exit_code);   // Next or End
//   // ... or, hearing the launcher's signals while it waits:
//   next = link.finish_attempt(attempt, exit_code, signals.read_fd(), on_signal);

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "xla_spawn/base/error.h"
#include "xla_spawn/cluster/connection.h"
#include "xla_spawn/cluster/job_token.h"
#include "xla_spawn/cluster/liveness_probe.h"
#include "xla_spawn/cluster/wire.h"

namespace xs::cluster {

// How often a side with heartbeat timeout `timeout` beats: min(1 s, timeout / 4), four beats
// per timeout, so that one lost or late beat never counts as silence.
std::chrono::milliseconds heartbeat_interval_for(std::chrono::milliseconds timeout);

// join()'s master fell silent (no heartbeat within the timeout): on node 0, whose master is
// its own rendezvous server, the server's fate says why.
class MasterLost : public PeerFailure {
 public:
  using PeerFailure::PeerFailure;
};

struct NodeLinkOptions {
  Register node;  // this node's registration
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{5000};
  // Hears, once a silence, that the master answered the liveness probe (for the console).
  std::function<void(const std::string&)> notice;
};

struct JobOrder {
  enum class Kind { kStop, kNext, kEnd };
  Kind kind = Kind::kStop;
  uint32_t attempt = 0;   // kStop, kNext
  int exit_code = 0;      // kEnd
  std::string text;       // kStop: the reason; kEnd: the job's summary; kNext: the root cause
  bool lost = false;      // kEnd: this node's own finding, the master gone without a word
};

class NodeLink {
 public:
  NodeLink(std::string master_addr, uint16_t port, JobToken token, NodeLinkOptions options);

  // Connects (retrying until `deadline`: the master may start later), authenticates,
  // registers and waits for the world until `verdict_deadline` (later than `deadline`, so that
  // the master's word on who never came arrives first). Throws Timeout when the master cannot
  // be reached in time or a listener does not answer the handshake within
  // kHandshakeTimeout, PeerFailure when it refuses (with its words) or ends the job during
  // the rendezvous (e.g. another node never came).
  World join(Clock::time_point deadline, Clock::time_point verdict_deadline);

  // A master answers a connection at once; a listener silent this long is something else.
  static constexpr std::chrono::seconds kHandshakeTimeout{10};

  // Poll it for input (an epoll set of the connection and the liveness probe's attempts).
  int fd() const;
  // When service() must run again at the latest (a heartbeat is due, or the master's
  // silence would reach the timeout).
  Clock::time_point service_deadline() const;
  // Reads what has arrived, answers with heartbeats when due, and returns the orders.
  std::vector<JobOrder> service();
  // Queued and written without blocking.
  void report_failure(const Failed& failed);
  // Sends AttemptDone and waits (heartbeats continue) for Next or End; a Stop meanwhile is
  // ignored (the attempt is over here already). When `wake_fd` (if not -1) becomes readable,
  // calls `on_wake`, which may end the wait with an order of its own (a second interrupt).
  using WakeHandler = std::function<std::optional<JobOrder>()>;
  JobOrder finish_attempt(uint32_t attempt, int exit_code, int wake_fd = -1,
                          const WakeHandler& on_wake = {});

  const std::string& master() const { return master_text_; }

 private:
  JobOrder lost(const std::string& why);
  void send(const Message& m);
  void look_past_world();
  std::string counted_lost(const std::string& why) const;
  std::string probe_refused(const std::string& why) const;
  Clock::time_point stuck_after() const;
  std::optional<std::string> stuck_connection(Clock::time_point now);
  // The liveness probe while the master is silent: the master's refusal, if it gave one.
  std::optional<std::string> keep_alive(Clock::time_point now);
  void wait(Clock::time_point deadline) const;

  std::string master_addr_;
  uint16_t port_;
  std::string master_text_;  // "198.18.0.1:29500"
  JobToken token_;
  NodeLinkOptions options_;
  std::optional<SocketAddress> master_address_;  // resolved once: a probe must not wait on DNS
  std::optional<Connection> connection_;
  Fd events_;  // epoll: the connection, and the probe's attempts
  std::unique_ptr<LivenessProbe> probe_;  // while the master is silent
  bool vouched_ = false;  // the probe answered since the connection last moved
  Clock::time_point last_heard_;  // on the connection, or through the probe
  Clock::time_point last_moved_;  // on the connection
  Clock::time_point last_down_;   // the probe's last failed attempt since (or last_moved_)
  Clock::time_point next_heartbeat_;
  bool ended_ = false;
  std::deque<Message> pending_;  // read behind World by look_past_world(), for service()
};

}  // namespace xs::cluster
