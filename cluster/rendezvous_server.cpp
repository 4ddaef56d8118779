#include "xla_spawn/cluster/rendezvous_server.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "xla_spawn/base/io.h"
#include "xla_spawn/cluster/node_link.h"

#include "xla_spawn/cluster/handshake.h"
#include "xla_spawn/cluster/store_table.h"

namespace xs::cluster {
namespace {

// At most this many log lines per window; the rest are counted and summarised, so a flood
// of bad connections cannot flood the master's console.
constexpr int kLogLinesPerWindow = 10;
constexpr auto kLogWindow = std::chrono::seconds(10);

}  // namespace

// Named, not anonymous: Impl below holds one, and a class with external linkage may not hold a
// member of an anonymous namespace's type once this file is compiled inside a unity file.
namespace detail {

class RateLimitedLog {
 public:
  explicit RateLimitedLog(FILE* out) : out_(out) {}
  void line(const std::string& text) {
    const auto now = Clock::now();
    if (now - window_start_ >= kLogWindow) {
      if (suppressed_ > 0) write(fmt::format("{} more line(s) suppressed", suppressed_));
      window_start_ = now;
      lines_ = 0;
      suppressed_ = 0;
    }
    if (lines_ >= kLogLinesPerWindow) {
      ++suppressed_;
      return;
    }
    ++lines_;
    write(text);
  }
  // Not counted against the window (the status a person asked for, the rendezvous progress).
  void always(const std::string& text) { write(text); }

 private:
  void write(const std::string& text) {
    if (out_ == nullptr) return;
    std::fputs(fmt::format("xla-spawn rendezvous: {}\n", text).c_str(), out_);
    std::fflush(out_);
  }
  FILE* out_;
  Clock::time_point window_start_{};
  int lines_ = 0;
  int suppressed_ = 0;
};

}  // namespace detail

class RendezvousServer::Impl {
 public:
  Impl(Fd listener, JobToken token, ServerConfig config);
  int run();

 private:
  enum class State { kHello, kAuth, kReady };
  // A store request waiting for keys to appear.
  struct Pending {
    std::vector<std::string> keys;
    bool want_value = false;  // StoreGet (reply StoreValue) or StoreWait (reply StoreOk)
    uint32_t timeout_ms = 0;
    Clock::time_point deadline;
  };
  struct Client {
    explicit Client(Connection c) : conn(std::move(c)) {}
    Connection conn;
    State state = State::kHello;
    Role role = Role::kNode;
    Nonce client_nonce{};
    Nonce server_nonce{};
    int node = -1;  // set once a launcher's Register is accepted
    Clock::time_point accepted;
    Clock::time_point last_heard;  // on this connection, or a launcher's through Alive
    Clock::time_point next_heartbeat;
    std::optional<Pending> pending;
    bool closing = false;  // close once everything queued is written
    bool vouched = false;  // a launcher heard through Alive since its last message here
  };

  void accept_all();
  void serve(Client& c, uint32_t events);
  void on_message(Client& c, Message m);
  void on_hello(Client& c, const Hello& hello);
  void on_auth(Client& c, const Auth& auth);
  void on_node_message(Client& c, Message m);
  void on_alive(Client& c, const Alive& alive, Clock::time_point now);
  void lose_node(int node, const std::string& reason, Clock::time_point now);
  void on_store_message(Client& c, Message m);
  void answer_pending(Client& c, Clock::time_point now);
  void refuse(Client& c, const std::string& why);
  void dispatch(const std::vector<Outgoing>& out);
  void send(Client& c, const Message& m);
  void update_interest(Client& c);
  void drop(int fd, const std::string& reason);
  void check_timers(Clock::time_point now);
  // Authenticated, and registered if it is a launcher: no longer bound by auth_timeout.
  static bool settled(const Client& c) {
    return c.state == State::kReady && (c.role == Role::kStore || c.node >= 0);
  }
  Clock::time_point next_deadline() const;
  bool finished(Clock::time_point now) const;
  void on_status_request(Clock::time_point now);

  Fd listener_;
  Fd epoll_;
  JobToken token_;
  ServerConfig config_;
  JobCoordinator job_;
  std::unordered_map<int, std::unique_ptr<Client>> clients_;  // by fd
  std::vector<int> node_fds_;                                 // by node; -1 when not connected
  std::vector<std::string> lost_why_;                         // by node; why it was dropped
  StoreTable store_;
  detail::RateLimitedLog log_;
  std::optional<Clock::time_point> ended_at_;
  Clock::time_point next_progress_ = Clock::time_point::max();  // while joining
  std::optional<Clock::time_point> last_status_;  // the last status asked for on status_fd
};

RendezvousServer::RendezvousServer(Fd listener, JobToken token, ServerConfig config)
    : impl_(std::make_unique<Impl>(std::move(listener), std::move(token), std::move(config))) {}
RendezvousServer::~RendezvousServer() = default;
int RendezvousServer::run() {
  return impl_->run();
}

RendezvousServer::Impl::Impl(Fd listener, JobToken token, ServerConfig config)
    : listener_(std::move(listener)),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)),
      token_(std::move(token)),
      config_(std::move(config)),
      job_(config_.job, Clock::now()),
      node_fds_(static_cast<size_t>(config_.job.nnodes), -1),
      lost_why_(static_cast<size_t>(config_.job.nnodes)),
      store_(config_.max_store_bytes),
      log_(config_.log) {
  if (epoll_.get() < 0) throw IoError(errno_message("epoll_create1", errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listener_.get();
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &ev) != 0) {
    throw IoError(errno_message("epoll_ctl(listener)", errno));
  }
  if (config_.status_fd >= 0) {
    set_nonblocking(config_.status_fd);  // drained until empty: it must not block
    ev.data.fd = config_.status_fd;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, config_.status_fd, &ev) != 0) {
      throw IoError(errno_message("epoll_ctl(status)", errno));
    }
  }
  if (config_.progress_interval.count() > 0) next_progress_ = Clock::now() + config_.progress_interval;
}

int RendezvousServer::Impl::run() {
  std::vector<epoll_event> events(256);
  for (;;) {
    const auto now = Clock::now();
    check_timers(now);
    if (finished(now)) return job_.exit_code();
    const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()),
                               poll_timeout_ms(next_deadline()));
    if (n < 0 && errno != EINTR) throw IoError(errno_message("epoll_wait", errno));
    for (int i = 0; i < n; ++i) {
      const int fd = events[static_cast<size_t>(i)].data.fd;
      if (fd == listener_.get()) {
        accept_all();
        continue;
      }
      if (fd == config_.status_fd) {
        on_status_request(Clock::now());
        continue;
      }
      auto it = clients_.find(fd);
      if (it != clients_.end()) serve(*it->second, events[static_cast<size_t>(i)].events);
    }
  }
}

// Drains the request (a signalfd's records, a pipe's bytes); asked twice within a second (a
// `kill -USR1` to the launcher's group reaches the launcher, which passes it on, and this
// process), it answers once.
void RendezvousServer::Impl::on_status_request(Clock::time_point now) {
  char buffer[512];
  while (::read(config_.status_fd, buffer, sizeof buffer) > 0) {
  }
  if (last_status_ && now - *last_status_ < std::chrono::seconds(1)) return;
  last_status_ = now;
  log_.always(job_.status(now));
}

bool RendezvousServer::Impl::finished(Clock::time_point now) const {
  if (!ended_at_) return false;
  if (now >= *ended_at_ + config_.linger) return true;
  for (int fd : node_fds_) {
    if (fd >= 0) return false;
  }
  return true;
}

void RendezvousServer::Impl::accept_all() {
  for (;;) {
    SocketAddress peer;
    peer.length = sizeof peer.storage;
    const int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&peer.storage),
                             &peer.length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) log_.line(errno_message("accept", errno));
      return;
    }
    if (clients_.size() >= config_.max_connections) {
      log_.line(fmt::format("refused {}: already {} connections", peer.text(), clients_.size()));
      ::close(fd);
      continue;
    }
    auto client = std::make_unique<Client>(Connection(Fd(fd), peer.text()));
    client->accepted = client->last_heard = Clock::now();
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      log_.line(errno_message("epoll_ctl(client)", errno));
      continue;  // the Client never existed: the Fd closes with it
    }
    clients_.emplace(fd, std::move(client));
  }
}

void RendezvousServer::Impl::serve(Client& c, uint32_t events) {
  const int fd = c.conn.fd();
  try {
    if (events & EPOLLOUT) c.conn.flush();
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
      const bool open = c.conn.read_some();
      while (!c.closing) {
        std::optional<Message> m = c.conn.next();
        if (!m) break;
        c.last_heard = Clock::now();
        c.vouched = false;
        on_message(c, std::move(*m));
        if (!clients_.contains(fd)) return;  // dropped while handling
      }
      if (!open) return drop(fd, "connection closed");
    }
    if (c.closing && !c.conn.wants_write()) return drop(fd, "");
    update_interest(c);
  } catch (const ProtocolError& e) {
    refuse(c, fmt::format("protocol error: {}", e.what()));
  } catch (const ConnectionClosed&) {
    drop(fd, "connection closed");
  } catch (const IoError& e) {
    drop(fd, e.what());
  }
}

void RendezvousServer::Impl::on_message(Client& c, Message m) {
  switch (c.state) {
    case State::kHello:
      if (const auto* hello = std::get_if<Hello>(&m)) return on_hello(c, *hello);
      return refuse(c, fmt::format("expected Hello, got {}", message_name(m)));
    case State::kAuth:
      if (const auto* auth = std::get_if<Auth>(&m)) return on_auth(c, *auth);
      return refuse(c, fmt::format("expected Auth, got {}", message_name(m)));
    case State::kReady:
      return c.role == Role::kNode ? on_node_message(c, std::move(m))
                                   : on_store_message(c, std::move(m));
  }
}

void RendezvousServer::Impl::on_hello(Client& c, const Hello& hello) {
  if (hello.magic != kProtocolMagic) {
    return refuse(c, fmt::format("not an xla-spawn client (magic 0x{:08x})", hello.magic));
  }
  if (hello.version != kProtocolVersion) {
    return refuse(c, fmt::format("rendezvous protocol version {}, the master speaks version {}: run "
                                 "the same xla-spawn on every node",
                                 hello.version, kProtocolVersion));
  }
  c.role = hello.role;
  c.client_nonce = hello.nonce;
  c.server_nonce = random_nonce();
  c.state = State::kAuth;
  send(c, Challenge{kProtocolVersion, c.server_nonce});
}

void RendezvousServer::Impl::on_auth(Client& c, const Auth& auth) {
  if (!mac_equal(auth.mac, token_.mac(kClientProof, c.server_nonce, c.client_nonce))) {
    return refuse(c, "wrong job token: set XLA_SPAWN_JOB_TOKEN (or share the token file) the "
                     "same on every node");
  }
  c.state = State::kReady;
  c.conn.set_frame_limit(kMaxFrameBytes);
  c.next_heartbeat = Clock::now() + config_.heartbeat_interval;
  send(c, Welcome{token_.mac(kServerProof, c.client_nonce, c.server_nonce)});
}

void RendezvousServer::Impl::on_node_message(Client& c, Message m) {
  const auto now = Clock::now();
  if (c.node < 0) {
    if (const auto* alive = std::get_if<Alive>(&m)) return on_alive(c, *alive, now);
    const auto* reg = std::get_if<Register>(&m);
    if (reg == nullptr) return refuse(c, fmt::format("expected Register, got {}", message_name(m)));
    // Each side beats at its own pace: one whose timeout does not hold four of the other's
    // beats would count them as silence and declare a healthy node or master lost.
    const std::chrono::milliseconds node_timeout(reg->heartbeat_timeout_ms);
    if (node_timeout < 4 * config_.heartbeat_interval ||
        config_.heartbeat_timeout < 4 * heartbeat_interval_for(node_timeout)) {
      return refuse(c, fmt::format("node {} (host {}) has XLA_SPAWN_HEARTBEAT_TIMEOUT_MS {}, the "
                                   "master {}: set it alike on every node (each side beats every "
                                   "min(1 s, its timeout / 4), and four beats must fit in the "
                                   "other's timeout)",
                                   reg->node, printable_text(reg->hostname),
                                   reg->heartbeat_timeout_ms, config_.heartbeat_timeout.count()));
    }
    auto result = job_.on_register(*reg);
    if (auto* refusal = std::get_if<std::string>(&result)) return refuse(c, *refusal);
    c.node = static_cast<int>(reg->node);
    node_fds_[reg->node] = c.conn.fd();
    lost_why_[reg->node].clear();
    return dispatch(std::get<std::vector<Outgoing>>(result));
  }
  if (std::holds_alternative<Heartbeat>(m)) return;
  if (const auto* failed = std::get_if<Failed>(&m)) return dispatch(job_.on_failed(c.node, *failed, now));
  if (const auto* done = std::get_if<AttemptDone>(&m)) {
    dispatch(job_.on_attempt_done(c.node, *done, now));
    for (auto& [fd, other] : clients_) answer_pending(*other, now);
    return;
  }
  refuse(c, fmt::format("node {} sent {}, which only the master sends", c.node, message_name(m)));
}

// A registered node's launcher, on a new connection while its own has fallen silent: that
// connection counts as heard (TCP may hold back what it carries until its retransmission
// timer fires), and the answer is the master's heartbeat. A node no longer in the job hears
// why (what it would read on its old connection once that moves again).
void RendezvousServer::Impl::on_alive(Client& c, const Alive& alive, Clock::time_point now) {
  const size_t node = alive.node;
  if (node >= node_fds_.size() || job_.registered_pid(static_cast<int>(node)) == 0 ||
      job_.registered_pid(static_cast<int>(node)) != alive.pid) {
    return refuse(c, fmt::format("node {} (pid {}) is not a registered node of this job",
                                 alive.node, alive.pid));
  }
  c.closing = true;  // once the answer is written
  const auto it = node_fds_[node] >= 0 ? clients_.find(node_fds_[node]) : clients_.end();
  if (it == clients_.end()) {
    const std::string& why = lost_why_[node];
    return send(c, ErrorReply{fmt::format("it counted node {} lost: {}", node,
                                          why.empty() ? "its connection closed" : why)});
  }
  Client& own = *it->second;
  if (!alive.leaving.empty()) return lose_node(static_cast<int>(node), alive.leaving, now);
  // Said once a silence, and only of one that beats would not have ended (the node probes
  // when the master's beats stop coming; its own may still come through).
  if (now - own.last_heard >= 2 * config_.heartbeat_interval) {
    if (!own.vouched) {
      log_.line(fmt::format("node {} answered on a new connection; its own had been silent for "
                            "{:.1f} s (a network outage, or a slow link)",
                            node, std::chrono::duration<double>(now - own.last_heard).count()));
    }
    own.vouched = true;
  }
  own.last_heard = now;
  send(c, Heartbeat{});
}

void RendezvousServer::Impl::on_store_message(Client& c, Message m) {
  if (c.pending) return refuse(c, "a second store request before the first was answered");
  const auto now = Clock::now();
  if (auto* set = std::get_if<StoreSet>(&m)) {
    if (auto error = store_.set(set->key, std::move(set->value))) {
      return send(c, ErrorReply{*error});
    }
    send(c, StoreOk{});
    for (auto& [fd, other] : clients_) answer_pending(*other, now);
    return;
  }
  Pending p;
  if (auto* get = std::get_if<StoreGet>(&m)) {
    p = {{get->key}, true, get->timeout_ms, now + std::chrono::milliseconds(get->timeout_ms)};
  } else if (auto* wait = std::get_if<StoreWait>(&m)) {
    p = {std::move(wait->keys), false, wait->timeout_ms,
         now + std::chrono::milliseconds(wait->timeout_ms)};
  } else {
    return refuse(c, fmt::format("a store client sent {}", message_name(m)));
  }
  c.pending = std::move(p);
  answer_pending(c, now);
}

// Answers the client's waiting request when its keys are all there, or with an error once its
// deadline has passed.
void RendezvousServer::Impl::answer_pending(Client& c, Clock::time_point now) {
  if (!c.pending) return;
  const Pending& p = *c.pending;
  if (store_.has_all(p.keys)) {
    if (p.want_value) {
      send(c, StoreValue{*store_.find(p.keys.front())});
    } else {
      send(c, StoreOk{});
    }
    c.pending.reset();
  } else if (const int finished = job_.finished_node(); finished >= 0) {
    send(c, ErrorReply{fmt::format(
                "store: key '{}' is missing, and every replica of node {} has exited 0 without "
                "setting it (a replica that left a collective early, or nodes that ran different "
                "collectives: another program or other arguments)",
                store_.first_missing(p.keys).value_or(""), finished)});
    c.pending.reset();
  } else if (now >= p.deadline) {
    send(c, ErrorReply{fmt::format("store: key '{}' not set within {} ms",
                                   store_.first_missing(p.keys).value_or(""), p.timeout_ms)});
    c.pending.reset();
  }
}

// Tells the peer why (when it still listens), logs it, and closes once that is written.
void RendezvousServer::Impl::refuse(Client& c, const std::string& why) {
  log_.line(fmt::format("refused {}{}: {}", c.conn.peer(),
                        c.node >= 0 ? fmt::format(" (node {})", c.node) : "", why));
  try {
    send(c, ErrorReply{why});
  } catch (const IoError&) {
  }
  c.closing = true;
  if (c.node >= 0) {
    const int node = c.node;
    node_fds_[static_cast<size_t>(node)] = -1;
    lost_why_[static_cast<size_t>(node)] = fmt::format("broke the protocol: {}", why);
    c.node = -1;
    dispatch(job_.on_lost(node, fmt::format("broke the protocol: {}", why), wall_ns_now(), Clock::now()));
  }
  if (!c.conn.wants_write()) drop(c.conn.fd(), "");
}

void RendezvousServer::Impl::dispatch(const std::vector<Outgoing>& out) {
  for (const Outgoing& o : out) {
    if (std::holds_alternative<Next>(o.message)) store_.clear();  // the last attempt's gloo keys
    if (std::holds_alternative<End>(o.message)) ended_at_ = Clock::now();
    for (int node = 0; node < static_cast<int>(node_fds_.size()); ++node) {
      const int fd = node_fds_[static_cast<size_t>(node)];
      if (fd < 0 || (o.node != Outgoing::kEveryNode && o.node != node)) continue;
      auto it = clients_.find(fd);
      if (it == clients_.end()) continue;
      try {
        send(*it->second, o.message);
      } catch (const IoError&) {
        // Its loss surfaces when the connection is next read.
      }
    }
  }
}

void RendezvousServer::Impl::send(Client& c, const Message& m) {
  c.conn.send(m);
  update_interest(c);
}

void RendezvousServer::Impl::update_interest(Client& c) {
  epoll_event ev{};
  ev.events = EPOLLIN | (c.conn.wants_write() ? EPOLLOUT : 0u);
  ev.data.fd = c.conn.fd();
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.conn.fd(), &ev);
}

// Forgets the client; a node's launcher that goes is lost to the job (unless it had finished).
void RendezvousServer::Impl::drop(int fd, const std::string& reason) {
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  const int node = it->second->node;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  clients_.erase(it);
  if (node < 0) return;
  node_fds_[static_cast<size_t>(node)] = -1;
  if (ended_at_) return;
  lost_why_[static_cast<size_t>(node)] = reason;
  log_.line(fmt::format("lost node {}: {}", node, reason));
  dispatch(job_.on_lost(node,
                        fmt::format("{} (its xla-spawn exited or was killed, or the host went down)",
                                    reason),
                        wall_ns_now(), Clock::now()));
}

void RendezvousServer::Impl::check_timers(Clock::time_point now) {
  if (job_.phase() == JobCoordinator::Phase::kJoining && now >= next_progress_) {
    next_progress_ = now + config_.progress_interval;
    if (now < job_.next_deadline()) log_.always(job_.status(now));  // not at the timeout's end
  }
  dispatch(job_.on_tick(now));
  std::vector<std::pair<int, std::string>> to_drop;
  for (auto& [fd, c] : clients_) {
    if (!settled(*c) && now - c->accepted >= config_.auth_timeout) {
      log_.line(fmt::format("refused {}: did not authenticate and register within {} ms",
                            c->conn.peer(), config_.auth_timeout.count()));
      to_drop.emplace_back(fd, "");
      continue;
    }
    answer_pending(*c, now);
    if (c->node < 0 || ended_at_) continue;
    if (now - c->last_heard >= config_.heartbeat_timeout) {
      to_drop.emplace_back(fd, fmt::format("no heartbeat for {:.1f} s (host frozen, launcher "
                                           "stopped, or network down)",
                                           std::chrono::duration<double>(now - c->last_heard).count()));
      continue;
    }
    if (now >= c->next_heartbeat) {
      c->next_heartbeat = now + config_.heartbeat_interval;
      try {
        send(*c, Heartbeat{});
      } catch (const IoError& e) {
        to_drop.emplace_back(fd, e.what());
      }
    }
  }
  for (const auto& [fd, reason] : to_drop) {
    auto it = clients_.find(fd);
    if (it == clients_.end()) continue;
    if (it->second->node >= 0 && !reason.empty()) {
      lose_node(it->second->node, reason, now);  // drop() would word it as a closed connection
    } else {
      drop(fd, reason);
    }
  }
}

// Node `node` is lost for `reason` (silent, or leaving by its own word): the job hears it, and
// its connection gets the reason ahead of the close. A node that was stopped reads it when it
// runs again: the silence was its own, not the master's.
void RendezvousServer::Impl::lose_node(int node, const std::string& reason, Clock::time_point now) {
  const int fd = node_fds_[static_cast<size_t>(node)];
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  node_fds_[static_cast<size_t>(node)] = -1;
  lost_why_[static_cast<size_t>(node)] = reason;
  it->second->node = -1;
  log_.line(fmt::format("lost node {}: {}", node, reason));
  dispatch(job_.on_lost(node, reason, wall_ns_now(), now));
  try {
    it->second->conn.send(ErrorReply{reason});
    it->second->conn.flush();
  } catch (const IoError&) {
  }
  drop(fd, reason);
}

Clock::time_point RendezvousServer::Impl::next_deadline() const {
  Clock::time_point next = std::min(job_.next_deadline(), Clock::now() + config_.heartbeat_interval);
  if (job_.phase() == JobCoordinator::Phase::kJoining) next = std::min(next, next_progress_);
  if (ended_at_) next = std::min(next, *ended_at_ + config_.linger);
  for (const auto& [fd, c] : clients_) {
    if (!settled(*c)) next = std::min(next, c->accepted + config_.auth_timeout);
    if (c->pending) next = std::min(next, c->pending->deadline);
    if (c->node >= 0) {
      next = std::min({next, c->next_heartbeat, c->last_heard + config_.heartbeat_timeout});
    }
  }
  return next;
}

}  // namespace xs::cluster
