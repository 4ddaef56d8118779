#include "xla_spawn/cluster/node_link.h"

#include <poll.h>
#include <sys/epoll.h>

#include <algorithm>

#include <fmt/format.h>

#include "xla_spawn/cluster/coordinator.h"
#include "xla_spawn/cluster/handshake.h"

namespace xs::cluster {
namespace {

constexpr const char* kClosed =
    "connection closed (its xla-spawn exited or was killed, or the host went down)";

// The probe starts after two heartbeat intervals of silence (one late beat is no sign) and
// opens a connection four times an interval, each given probe_patience() to be answered.
constexpr int kProbeAfterBeats = 2;
constexpr int kProbesPerBeat = 4;

// How long one attempt may take: four round trips (connect, the handshake's two, Alive), so
// half the timeout, at least an interval and at most 4 s; at most 16 attempts are under way.
std::chrono::milliseconds probe_patience(std::chrono::milliseconds interval,
                                         std::chrono::milliseconds timeout) {
  return std::clamp<std::chrono::milliseconds>(timeout / 2, interval,
                                               std::max(interval, std::chrono::milliseconds(4000)));
}

}  // namespace

std::chrono::milliseconds heartbeat_interval_for(std::chrono::milliseconds timeout) {
  return std::min(std::chrono::milliseconds(1000), timeout / 4);
}

NodeLink::NodeLink(std::string master_addr, uint16_t port, JobToken token, NodeLinkOptions options)
    : master_addr_(std::move(master_addr)),
      port_(port),
      master_text_(fmt::format("{}:{}", master_addr_, port)),
      token_(std::move(token)),
      options_(std::move(options)) {}

World NodeLink::join(Clock::time_point deadline, Clock::time_point verdict_deadline) {
  const auto start = Clock::now();
  try {
    master_address_ = resolve(master_addr_, port_);
    connection_ = connect_to(*master_address_, deadline);
  } catch (const Timeout& e) {
    throw Timeout(fmt::format(
        "{} (tried for {:.0f} s, the rendezvous timeout): is node 0's xla-spawn running, and "
        "is --master-addr its address and --master-port its port?",
        e.what(), std::chrono::duration<double>(Clock::now() - start).count()));
  }
  master_text_ = connection_->peer();
  try {
    client_handshake(*connection_, token_, Role::kNode,
                     std::min(deadline, Clock::now() + kHandshakeTimeout));
  } catch (const Timeout&) {
    throw Timeout(fmt::format(
        "{} accepted the connection but did not answer xla-spawn's handshake: is another "
        "program listening on port {}?",
        master_text_, port_));
  } catch (const ProtocolError& e) {
    throw ProtocolError(fmt::format("{} answered xla-spawn's handshake with something else ({}): "
                                    "is another program listening on port {}?",
                                    master_text_, e.what(), port_));
  } catch (const ConnectionClosed&) {
    throw ConnectionClosed(fmt::format("{} closed the connection during xla-spawn's handshake: is "
                                       "another program listening on port {}?",
                                       master_text_, port_));
  }
  deadline = verdict_deadline;
  connection_->send_blocking(options_.node, deadline);
  events_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
  if (events_.get() < 0) throw IoError(errno_message("epoll_create1", errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = connection_->fd();
  if (::epoll_ctl(events_.get(), EPOLL_CTL_ADD, connection_->fd(), &ev) != 0) {
    throw IoError(errno_message("epoll_ctl(master)", errno));
  }
  // The wait for the other nodes can be long: heartbeats flow meanwhile, so a master that
  // dies during it is noticed at once rather than at the rendezvous deadline.
  last_heard_ = last_moved_ = last_down_ = Clock::now();
  next_heartbeat_ = last_heard_ + options_.heartbeat_interval;
  // The probe waits for a word after Register: before the master has it, a probe would find
  // this node unknown (Register may be held back by TCP as well).
  bool heard = false;
  for (;;) {
    const bool open = connection_->read_some();
    const auto now = Clock::now();
    while (std::optional<Message> m = connection_->next()) {
      last_heard_ = last_moved_ = last_down_ = now;
      heard = true;
      vouched_ = false;
      if (auto* world = std::get_if<World>(&*m)) {
        look_past_world();
        return std::move(*world);
      }
      if (auto* refusal = std::get_if<ErrorReply>(&*m)) throw_refusal(*connection_, *refusal);
      if (auto* end = std::get_if<End>(&*m)) throw PeerFailure(end->summary);
    }
    if (!open) throw ConnectionClosed(fmt::format("{} closed the connection", master_text_));
    if (now >= deadline) {
      throw Timeout(fmt::format("the master at {} did not form the job within the rendezvous "
                                "timeout", master_text_));
    }
    if (heard) {
      if (std::optional<std::string> refusal = keep_alive(now)) {
        throw PeerFailure(probe_refused(*refusal));
      }
    }
    if (now - last_heard_ >= options_.heartbeat_timeout) {
      throw MasterLost(lost("no heartbeat during the rendezvous").text);
    }
    if (std::optional<std::string> stuck = stuck_connection(now)) {
      throw MasterLost(lost(*stuck).text);
    }
    if (now >= next_heartbeat_) send(Heartbeat{});
    wait(std::min(deadline, service_deadline()));
  }
}

// What came behind World, read before any replica starts: a node stopped while the job
// formed finds there the master's word that it was counted lost (or End), and leaves without
// starting its replicas (it used to start them, then stop them); anything else waits in
// pending_ for service().
void NodeLink::look_past_world() {
  connection_->read_some();  // at the close, what came before it is still read below
  while (std::optional<Message> m = connection_->next()) {
    if (const auto* word = std::get_if<ErrorReply>(&*m)) {
      throw PeerFailure(counted_lost(word->message));
    }
    if (const auto* end = std::get_if<End>(&*m)) throw PeerFailure(end->summary);
    if (!std::holds_alternative<Heartbeat>(*m)) pending_.push_back(std::move(*m));
  }
}

std::string NodeLink::counted_lost(const std::string& why) const {
  return fmt::format("xla-spawn: the master (node 0 at {}) counted this node lost: {}\n",
                     master_text_, why);
}

std::string NodeLink::probe_refused(const std::string& why) const {
  return fmt::format("xla-spawn: the master (node 0 at {}) refused this node's liveness probe: "
                     "{}\n",
                     master_text_, why);
}

// The probe stands in for the connection's beats while TCP holds them back after outages:
// TCP resends by about twice the time since the connection last moved, and a resend has to
// find the link up. So a connection may stay silent for two timeouts, plus twice as long as
// the link was seen failing since it last moved (a flapping link). Silent longer while the
// master answers on new connections, it carries nothing any more (a firewall or NAT that
// forgot it): the orders on it would never arrive.
Clock::time_point NodeLink::stuck_after() const {
  return last_moved_ + 2 * options_.heartbeat_timeout + 2 * (last_down_ - last_moved_);
}

std::optional<std::string> NodeLink::stuck_connection(Clock::time_point now) {
  if (now < stuck_after()) return std::nullopt;
  const std::string why = fmt::format(
      "the connection has carried nothing for {:.1f} s, though the master answers on new ones "
      "(a firewall or NAT that dropped it?)",
      std::chrono::duration<double>(now - last_moved_).count());
  // The master hears it on a new connection (its own carries nothing): every node then names
  // the same cause.
  try {
    const auto deadline =
        now + probe_patience(options_.heartbeat_interval, options_.heartbeat_timeout);
    Connection c = connect_to(*master_address_, deadline);
    client_handshake(c, token_, Role::kNode, deadline);
    c.send_blocking(Alive{options_.node.node, options_.node.pid,
                          fmt::format("its connection to the master has carried nothing for "
                                      "{:.1f} s, though both answer on new ones (a firewall or "
                                      "NAT that dropped it?)",
                                      std::chrono::duration<double>(now - last_moved_).count())},
                    deadline);
  } catch (const Error&) {
    // It finds the node silent instead.
  }
  return why;
}

std::optional<std::string> NodeLink::keep_alive(Clock::time_point now) {
  if (now - last_heard_ < kProbeAfterBeats * options_.heartbeat_interval) {
    probe_.reset();
    return std::nullopt;
  }
  if (!probe_) {
    probe_ = std::make_unique<LivenessProbe>(
        *master_address_, token_, Alive{options_.node.node, options_.node.pid, ""},
        options_.heartbeat_interval / kProbesPerBeat,
        probe_patience(options_.heartbeat_interval, options_.heartbeat_timeout), events_.get());
  }
  const LivenessProbe::Result result = probe_->step(now);
  last_down_ = std::max(last_down_, probe_->last_failure());
  switch (result) {
    case LivenessProbe::Result::kWaiting:
      return std::nullopt;
    case LivenessProbe::Result::kAlive:
      if (!vouched_ && options_.notice) {
        options_.notice(fmt::format(
            "the master (node 0 at {}) answered on a new connection; this node's own had been "
            "silent for {:.1f} s (a network outage, or a slow link)",
            master_text_, std::chrono::duration<double>(now - last_heard_).count()));
      }
      vouched_ = true;
      last_heard_ = now;
      probe_.reset();
      return std::nullopt;
    case LivenessProbe::Result::kRefused:
      return probe_->refusal();
  }
  return std::nullopt;
}

void NodeLink::wait(Clock::time_point deadline) const {
  pollfd p{events_.get(), POLLIN, 0};
  ::poll(&p, 1, poll_timeout_ms(deadline));  // EINTR too: the caller looks at the time
}

int NodeLink::fd() const {
  return connection_ && !ended_ ? events_.get() : -1;
}

Clock::time_point NodeLink::service_deadline() const {
  if (ended_) return Clock::time_point::max();
  if (!pending_.empty()) return Clock::time_point::min();
  const Clock::time_point probe =
      probe_ ? probe_->deadline() : last_heard_ + kProbeAfterBeats * options_.heartbeat_interval;
  return std::min(
      {next_heartbeat_, last_heard_ + options_.heartbeat_timeout, stuck_after(), probe});
}

std::vector<JobOrder> NodeLink::service() {
  std::vector<JobOrder> orders;
  if (ended_) return orders;
  try {
    const bool open = connection_->read_some();
    const auto next_message = [this]() -> std::optional<Message> {
      if (pending_.empty()) return connection_->next();
      Message m = std::move(pending_.front());
      pending_.pop_front();
      return m;
    };
    while (std::optional<Message> m = next_message()) {
      last_heard_ = last_moved_ = last_down_ = Clock::now();
      vouched_ = false;
      if (const auto* stop = std::get_if<Stop>(&*m)) {
        orders.push_back({JobOrder::Kind::kStop, stop->attempt, 0, stop->reason});
      } else if (const auto* next = std::get_if<Next>(&*m)) {
        orders.push_back({JobOrder::Kind::kNext, next->attempt, 0, next->cause});
      } else if (const auto* end = std::get_if<End>(&*m)) {
        ended_ = true;
        orders.push_back({JobOrder::Kind::kEnd, 0, end->exit_code, end->summary});
        return orders;
      } else if (const auto* word = std::get_if<ErrorReply>(&*m)) {
        // The master's last word before it closes: this node was the silent one (stopped, a
        // paused host), not the master.
        ended_ = true;
        return {{JobOrder::Kind::kEnd, 0, kJobFailedExitCode, counted_lost(word->message)}};
      } else if (!std::holds_alternative<Heartbeat>(*m)) {
        throw ProtocolError(fmt::format("the master sent {}", message_name(*m)));
      }
    }
    if (!open) return {lost(kClosed)};
    const auto now = Clock::now();
    if (std::optional<std::string> refusal = keep_alive(now)) {
      ended_ = true;
      return {{JobOrder::Kind::kEnd, 0, kJobFailedExitCode, probe_refused(*refusal)}};
    }
    if (now - last_heard_ >= options_.heartbeat_timeout) {
      return {lost(fmt::format("no heartbeat for {:.1f} s (host frozen or stopped, or network down)",
                               std::chrono::duration<double>(now - last_heard_).count()))};
    }
    if (std::optional<std::string> stuck = stuck_connection(now)) return {lost(*stuck)};
    if (now >= next_heartbeat_) send(Heartbeat{});
    connection_->flush();
  } catch (const ConnectionClosed&) {
    return {lost(kClosed)};
  } catch (const Error& e) {
    return {lost(e.what())};
  }
  return orders;
}

void NodeLink::report_failure(const Failed& failed) {
  try {
    send(failed);
  } catch (const IoError&) {
    // service() finds the broken connection and reports the master lost.
  }
}

JobOrder NodeLink::finish_attempt(uint32_t attempt, int exit_code, int wake_fd,
                                  const WakeHandler& on_wake) {
  try {
    send(AttemptDone{attempt, exit_code});
  } catch (const IoError&) {
  }
  // The wake fd is read before a restart is acted on: an interrupt that reached this node
  // while the master's Next was on its way was still received while waiting. Not before End:
  // the job's verdict is in hand, and signals pending with it (a scheduler's SIGTERM and a
  // hangup as the job ends) must not make the node leave "without" it.
  const auto hear_wake = [&](bool readable) -> std::optional<JobOrder> {
    if (wake_fd < 0 || !on_wake) return std::nullopt;
    if (!readable) {
      pollfd w{wake_fd, POLLIN, 0};
      if (::poll(&w, 1, 0) != 1 || (w.revents & POLLIN) == 0) return std::nullopt;
    }
    std::optional<JobOrder> order = on_wake();
    if (order) ended_ = true;
    return order;
  };
  for (;;) {
    for (const JobOrder& order : service()) {
      if (order.kind == JobOrder::Kind::kStop) continue;
      if (order.kind == JobOrder::Kind::kNext) {
        if (std::optional<JobOrder> own = hear_wake(false)) return *own;
      }
      return order;
    }
    pollfd p[3] = {{events_.get(), POLLIN, 0},
                   {wake_fd, POLLIN, 0},
                   {connection_->wants_write() ? connection_->fd() : -1, POLLOUT, 0}};
    ::poll(p, 3, poll_timeout_ms(service_deadline()));
    if ((p[1].revents & POLLIN) != 0) {
      if (std::optional<JobOrder> own = hear_wake(true)) return *own;
    }
  }
}

JobOrder NodeLink::lost(const std::string& why) {
  ended_ = true;
  return {JobOrder::Kind::kEnd, 0, kJobFailedExitCode,
          fmt::format("xla-spawn: lost the master (node 0 at {}): {}\n", master_text_, why), true};
}

// Every message tells the master this node is alive, so the next heartbeat is due a full
// interval after any message.
void NodeLink::send(const Message& m) {
  next_heartbeat_ = Clock::now() + options_.heartbeat_interval;
  connection_->send(m);
}

}  // namespace xs::cluster
