#include "xla_spawn/launcher/node_session.h"

#include <unistd.h>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/io.h"
#include "xla_spawn/cluster/handshake.h"
#include "xla_spawn/launcher/options.h"
#include "xla_spawn/launcher/replica_env.h"
#include "xla_spawn/replica/context.h"

namespace xs {
namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// The node-0 listener, with the likely cause when it cannot bind.
cluster::Fd listen_for_nodes(const NodeOptions& o) {
  try {
    return cluster::listen_on(o.master_addr, o.master_port);
  } catch (const Error& e) {
    throw UsageError(fmt::format("node 0 runs the job's rendezvous, but {}: is {} {} an "
                                 "address of this host, and is port {} free?",
                                 e.what(), o.master_addr_from, o.master_addr, o.master_port));
  }
}

// The local address that routes to the master. A host whose network is not up yet (a link
// down, no route) is asked again until the rendezvous deadline, as a master not listening yet
// is connected to again; it used to fail at once, and the master waited out its timeout.
std::string address_towards_master(const NodeOptions& o, cluster::Clock::time_point deadline) {
  constexpr auto kRetry = std::chrono::milliseconds(500);
  const auto start = cluster::Clock::now();
  for (bool said = false;; said = true) {
    try {
      return cluster::local_address_towards(o.master_addr, o.master_port);
    } catch (const IoError& e) {
      const auto now = cluster::Clock::now();
      if (now >= deadline) {
        throw Timeout(fmt::format(
            "{} (tried for {:.0f} s, the rendezvous timeout): is this host's network up, and "
            "is {} an address it can reach?",
            e.what(), std::chrono::duration<double>(now - start).count(), o.master_addr_from));
      }
      if (!said) {
        write_all(2, fmt::format("xla-spawn: node {}: {}; trying again until the rendezvous "
                                 "timeout ({} s)\n",
                                 o.node, e.what(), o.rdzv_timeout.count() / 1000));
      }
      cluster::sleep_until(std::min(now + kRetry, deadline));
    }
  }
}

// Where this node's replicas listen: XLA_SPAWN_HOST_ADDR, checked here (a socket bound to it)
// so that a wrong one fails before the job forms rather than in every replica's gloo set-up;
// else the local address that routes to the master. Either way a route to the master is
// waited for (and said to be missing).
std::string node_address(const NodeOptions& o, cluster::Clock::time_point deadline) {
  const std::optional<std::string> given = env_string(env_names::kHostAddr);
  if (!given) return address_towards_master(o, deadline);
  if (is_wildcard_address(*given)) {
    throw UsageError(fmt::format("{}={} is the wildcard address: give this host's address that "
                                 "the other nodes reach",
                                 env_names::kHostAddr, *given));
  }
  try {
    cluster::listen_on(*given, 0);
  } catch (const Error& e) {
    throw UsageError(fmt::format("{}={}: {}: it must be an address of this host, where its "
                                 "replicas listen",
                                 env_names::kHostAddr, *given, e.what()));
  }
  address_towards_master(o, deadline);
  return *given;
}

// The command as a shell would take it back ('it''s' quoted), cut to fit the wire.
std::string command_text(const std::vector<std::string>& command) {
  std::string text;
  for (const std::string& arg : command) {
    if (!text.empty()) text += ' ';
    const bool plain = !arg.empty() && arg.find_first_not_of("abcdefghijklmnopqrstuvwxyz"
                                                             "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                             "0123456789_-./=:,+@%") ==
                                           std::string::npos;
    if (plain) {
      text += arg;
      continue;
    }
    text += '\'';
    for (const char ch : arg) text += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    text += '\'';
  }
  if (text.size() > cluster::kMaxCommandBytes) {
    text = std::string(utf8_prefix(text, cluster::kMaxCommandBytes - 3)) + "...";
  }
  return text;
}

// A node may start before its master's name is in DNS: the name is looked up again until
// the rendezvous deadline, as a master not listening yet is connected to again.
void wait_for_master_name(const NodeOptions& o, cluster::Clock::time_point deadline) {
  const auto start = cluster::Clock::now();
  try {
    cluster::resolve_by(o.master_addr, o.master_port, deadline, std::chrono::milliseconds(500),
                        [&](const std::string& error) {
                          write_all(2, fmt::format("xla-spawn: node {}: {}; trying again until "
                                                   "the rendezvous timeout ({} s)\n",
                                                   o.node, error, o.rdzv_timeout.count() / 1000));
                        });
  } catch (const Timeout& e) {
    throw Timeout(fmt::format(
        "{} (tried for {:.0f} s, the rendezvous timeout): is {} node 0's name?", e.what(),
        std::chrono::duration<double>(cluster::Clock::now() - start).count(), o.master_addr_from));
  }
}

// Node 0's own rendezvous server, when it no longer runs (killed, exited, stopped): the cause
// of whatever node 0 then sees as the master's silence or a closed connection, in `text`.
std::optional<RendezvousProcess::Fate> server_fate(const RendezvousProcess& server) {
  std::optional<RendezvousProcess::Fate> gone = server.gone(std::chrono::milliseconds(500));
  if (gone) {
    gone->text = fmt::format("xla-spawn: this node's rendezvous server (pid {}) {}: the job "
                             "cannot go on without it\n",
                             server.pid(), gone->text);
  }
  return gone;
}

cluster::FailureKind wire_kind(LocalFailureKind kind) {
  switch (kind) {
    case LocalFailureKind::kExited: return cluster::FailureKind::kExited;
    case LocalFailureKind::kSignalled: return cluster::FailureKind::kSignalled;
    case LocalFailureKind::kTimedOut: return cluster::FailureKind::kTimedOut;
    case LocalFailureKind::kInterrupted: return cluster::FailureKind::kInterrupted;
    case LocalFailureKind::kLauncherError: return cluster::FailureKind::kLauncherError;
  }
  return cluster::FailureKind::kLauncherError;
}

std::string join_sizes(const cluster::World& world) {
  std::string text;
  for (const cluster::NodeInfo& n : world.nodes) text += fmt::format("{}{}", text.empty() ? "" : ",", n.nprocs);
  return text;
}

// "lost the master ...: connection closed" from "xla-spawn: lost the master ...\n...".
std::string first_line(const std::string& summary) {
  std::string line = summary.substr(0, summary.find('\n'));
  constexpr std::string_view kPrefix = "xla-spawn: ";
  if (line.rfind(kPrefix, 0) == 0) line.erase(0, kPrefix.size());
  return line.empty() ? "the job ended" : line;
}

}  // namespace

std::unique_ptr<NodeSession> NodeSession::join(const NodeOptions& o, int nprocs, int max_restarts,
                                               const std::vector<std::string>& command) {
  const cluster::JobToken token = cluster::JobToken::load();
  const auto heartbeat_timeout = std::chrono::milliseconds(
      env_int(kHeartbeatTimeoutEnv, 100, 3'600'000).value_or(kDefaultHeartbeatTimeoutMs));
  const auto heartbeat_interval = cluster::heartbeat_interval_for(heartbeat_timeout);
  std::unique_ptr<RendezvousProcess> server;
  if (o.node == 0) {
    cluster::Fd listener = listen_for_nodes(o);
    cluster::ServerConfig config;
    config.job = {o.nnodes, max_restarts, o.rdzv_timeout,
                  cluster::pick_free_port(o.master_addr), make_job_id()};
    config.heartbeat_interval = heartbeat_interval;
    config.heartbeat_timeout = heartbeat_timeout;
    server = std::make_unique<RendezvousProcess>(std::move(listener), token, config);
  }
  // The master judges the rendezvous timeout and tells every node which nodes never came; a
  // node waits a little longer than the timeout so that it hears the verdict rather than
  // giving up at the same moment without it.
  constexpr auto kVerdictMargin = std::chrono::seconds(5);
  const auto rendezvous_deadline = cluster::Clock::now() + o.rdzv_timeout;
  if (o.node != 0) wait_for_master_name(o, rendezvous_deadline);
  const std::string host_addr = node_address(o, rendezvous_deadline);
  cluster::NodeLinkOptions link_options;
  link_options.node = {static_cast<uint32_t>(o.node),
                       static_cast<uint32_t>(o.nnodes),
                       static_cast<uint32_t>(nprocs),
                       static_cast<int32_t>(::getpid()),
                       host_name(),
                       host_addr,
                       static_cast<uint32_t>(heartbeat_timeout.count()),
                       command_text(command)};
  link_options.heartbeat_interval = heartbeat_interval;
  link_options.heartbeat_timeout = heartbeat_timeout;
  link_options.notice = [](const std::string& text) {
    write_all(2, fmt::format("xla-spawn: {}\n", text));
  };
  cluster::NodeLink link(o.master_addr, o.master_port, token, link_options);
  write_all(2, fmt::format("xla-spawn: node {} of {} ({}, {}), {} replica(s): joining the job at "
                           "{}:{} (nodes from {}; waiting up to {} s)\n",
                           o.node, o.nnodes, link_options.node.hostname, host_addr, nprocs,
                           o.master_addr, o.master_port, o.source, o.rdzv_timeout.count() / 1000));
  cluster::World world;
  try {
    world = link.join(rendezvous_deadline, rendezvous_deadline + kVerdictMargin);
  } catch (const Error& e) {
    // On node 0 a master that fell silent, hung up or did not answer the handshake is this
    // node's own server, stopped or killed. One that exited did so after its last word (a
    // refusal, the rendezvous timeout), which stands, unless it went without one.
    if (server == nullptr) throw;
    const std::optional<RendezvousProcess::Fate> fate = server_fate(*server);
    if (!fate) throw;
    const bool without_a_word = dynamic_cast<const cluster::MasterLost*>(&e) != nullptr ||
                                dynamic_cast<const IoError*>(&e) != nullptr;
    if (fate->kind == RendezvousProcess::Fate::Kind::kExited && !without_a_word) throw;
    server->leave_now();  // a stopped one would be waited for in vain
    throw PeerFailure(fate->text);
  }
  std::unique_ptr<NodeSession> session(new NodeSession(o, std::move(link), std::move(server)));
  session->world_ = std::move(world);
  session->token_text_ = token.text();
  session->host_addr_ = host_addr;
  Placement& p = session->placement_;
  p.job_id = session->world_.job_id;
  p.node = o.node;
  p.nnodes = o.nnodes;
  for (int k = 0; k < o.nnodes; ++k) {
    const int n = static_cast<int>(session->world_.nodes[static_cast<size_t>(k)].nprocs);
    if (k < o.node) p.first_ordinal += n;
    p.world_size += n;
  }
  const std::string ordinals =
      nprocs == 1 ? fmt::format("ordinal {}", p.first_ordinal)
                  : fmt::format("ordinals {}-{}", p.first_ordinal, p.first_ordinal + nprocs - 1);
  write_all(2, fmt::format("xla-spawn: job {} formed: {} nodes, {} replicas (per node: {}); this "
                           "node runs {}\n",
                           p.job_id, o.nnodes, p.world_size, join_sizes(session->world_), ordinals));
  if (!session->world_.notice.empty()) {
    write_all(2, fmt::format("xla-spawn: note: {}\n", session->world_.notice));
  }
  if (session->world_.max_restarts != static_cast<uint32_t>(max_restarts)) {
    write_all(2, fmt::format("xla-spawn: node 0 decides restarts: its --max-restarts is {}, "
                             "this node's {} does not count\n",
                             session->world_.max_restarts, max_restarts));
  }
  return session;
}

NodeSession::NodeSession(const NodeOptions& options, cluster::NodeLink link,
                         std::unique_ptr<RendezvousProcess> server)
    : options_(options), server_(std::move(server)), link_(std::move(link)) {}

pid_t NodeSession::server_pid() const {
  return server_ != nullptr ? server_->pid() : -1;
}

std::vector<EnvVar> NodeSession::env() const {
  namespace n = env_names;
  std::vector<EnvVar> vars = {
      {n::kNode, std::to_string(options_.node)},
      {n::kNnodes, std::to_string(options_.nnodes)},
      {n::kNodeSizes, join_sizes(world_)},
      {n::kMasterAddr, options_.master_addr},
      {n::kMasterPort, std::to_string(options_.master_port)},
      {n::kHostAddr, host_addr_},
      {cluster::kJobTokenEnv, token_text_},
      {n::kTorchGroupRank, std::to_string(options_.node)},
      {n::kTorchGroupWorldSize, std::to_string(options_.nnodes)},
  };
  // torch.distributed's env:// rendezvous: rank 0 hosts its store at MASTER_ADDR:MASTER_PORT,
  // a port that was free on node 0 (unless the user chose them).
  const uint16_t torch_port = static_cast<uint16_t>(world_.torch_port);
  std::vector<EnvVar> torch =
      torch_store_env(options_.master_addr, [torch_port] { return std::optional<uint16_t>(torch_port); });
  // A MASTER_PORT exported for torchrun is most often the rendezvous's own --master-port,
  // which node 0's rendezvous holds: torch's store could not bind it there.
  const std::string rendezvous_port = std::to_string(options_.master_port);
  for (EnvVar& var : torch) {
    if (var.value == rendezvous_port) {
      if (var.name == env_names::kTorchMasterPort) {
        write_all(2, fmt::format("xla-spawn: MASTER_PORT={} in the environment is the rendezvous's "
                                 "--master-port; the replicas get MASTER_PORT={} for "
                                 "torch.distributed instead\n",
                                 rendezvous_port, torch_port));
      }
      var.value = std::to_string(torch_port);
    }
  }
  vars.insert(vars.end(), torch.begin(), torch.end());
  return vars;
}

std::optional<PeerStop> NodeSession::service() {
  std::optional<PeerStop> stop;
  for (const cluster::JobOrder& order : link_.service()) {
    switch (order.kind) {
      case cluster::JobOrder::Kind::kStop:
        if (order.attempt == static_cast<uint32_t>(attempt_) && !stop) {
          stop = PeerStop{order.text, false, 0, ""};
        }
        break;
      case cluster::JobOrder::Kind::kEnd: {
        const std::string text = ended_text(order);
        return PeerStop{first_line(text), true, order.exit_code, text};
      }
      case cluster::JobOrder::Kind::kNext:
        break;  // only after end_attempt; never during an attempt
    }
  }
  return stop;
}

void NodeSession::local_failure(const LocalFailure& failure) {
  cluster::Failed f;
  f.attempt = static_cast<uint32_t>(attempt_);
  f.local_ordinal = failure.local_ordinal;
  f.kind = wire_kind(failure.kind);
  f.exit_code = failure.exit_code;
  f.wall_ns = cluster::wall_ns_now();
  f.description = failure.description;
  f.tail = failure.tail;
  link_.report_failure(f);
}

PeerVerdict NodeSession::end_attempt(int attempt, int exit_code, int wake_fd,
                                     const WakeHandler& on_wake) {
  const auto wake = [this, &on_wake]() -> std::optional<cluster::JobOrder> {
    const std::optional<PeerVerdict> verdict = on_wake();
    if (!verdict) return std::nullopt;
    if (server_ != nullptr) server_->leave_now();
    return cluster::JobOrder{cluster::JobOrder::Kind::kEnd, 0, verdict->exit_code, verdict->summary};
  };
  const cluster::JobOrder order =
      link_.finish_attempt(static_cast<uint32_t>(attempt), exit_code, on_wake ? wake_fd : -1, wake);
  if (order.kind == cluster::JobOrder::Kind::kNext) {
    attempt_ = static_cast<int>(order.attempt);
    return {true, attempt_, 0, order.text};
  }
  return {false, attempt, order.exit_code, ended_text(order)};
}

// On node 0 a lost master is this node's own server: its fate is the cause.
std::string NodeSession::ended_text(const cluster::JobOrder& order) const {
  if (!order.lost || server_ == nullptr) return order.text;
  const std::optional<RendezvousProcess::Fate> fate = server_fate(*server_);
  return fate ? fate->text : order.text;
}

}  // namespace xs
