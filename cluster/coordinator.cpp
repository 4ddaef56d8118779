#include "xla_spawn/cluster/coordinator.h"

#include <algorithm>
#include <cstdint>
#include <tuple>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/int_ranges.h"
#include "xla_spawn/base/io.h"

namespace xs::cluster {
namespace {

// Lower sorts first as the root cause (see the rules in the header).
int priority(FailureKind kind) {
  switch (kind) {
    case FailureKind::kTimedOut:
    case FailureKind::kInterrupted:
      return 0;
    case FailureKind::kLost:
    case FailureKind::kSignalled:
    case FailureKind::kLauncherError:
      return 1;
    case FailureKind::kExited:
      return 2;
  }
  return 3;
}

}  // namespace

JobCoordinator::JobCoordinator(CoordinatorConfig config, Clock::time_point now)
    : config_(std::move(config)),
      joining_deadline_(now + config_.rdzv_timeout),
      attempt_started_(now),
      nodes_(static_cast<size_t>(config_.nnodes)) {
  XS_CHECK_ARG(config_.nnodes >= 1 && config_.nnodes <= static_cast<int>(kMaxNodes),
               "nnodes {}: expected 1..{}", config_.nnodes, kMaxNodes);
}

std::variant<std::string, std::vector<Outgoing>> JobCoordinator::on_register(const Register& raw) {
  // What a node says of itself is printed on every node's console: no terminal controls.
  Register reg = raw;
  reg.hostname = printable_text(raw.hostname);
  reg.command = printable_text(raw.command);
  if (printable_text(raw.host_addr) != raw.host_addr) {
    return fmt::format("node {} (host {}) gave the address '{}', which is no address",
                       reg.node, reg.hostname, printable_text(raw.host_addr));
  }
  if (reg.nnodes != static_cast<uint32_t>(config_.nnodes)) {
    return fmt::format("node {} (host {}) was started with --nnodes {}, the master with --nnodes {}",
                       reg.node, reg.hostname, reg.nnodes, config_.nnodes);
  }
  if (reg.node >= static_cast<uint32_t>(config_.nnodes)) {
    return fmt::format("node rank {} (host {}) is outside 0..{} (--nnodes {})", reg.node,
                       reg.hostname, config_.nnodes - 1, config_.nnodes);
  }
  if (reg.nprocs < 1 || reg.nprocs > kMaxNodeProcs) {
    return fmt::format("node {} (host {}) asks for {} replicas: expected 1..{}", reg.node,
                       reg.hostname, reg.nprocs, kMaxNodeProcs);
  }
  NodeState& n = nodes_[reg.node];
  if (n.registered) {
    return fmt::format("node rank {} is already taken by host {} ({}, pid {}); host {} ({}, pid {}) "
                       "claimed it too: give every host its own --node-rank",
                       reg.node, n.info.hostname, n.info.host_addr, n.info.pid, reg.hostname,
                       reg.host_addr, reg.pid);
  }
  if (phase_ != Phase::kJoining) {
    return fmt::format("node {} (host {}) registered after the job started: it runs without it",
                       reg.node, reg.hostname);
  }
  n.registered = true;
  n.left.clear();
  n.info = reg;
  if (!std::all_of(nodes_.begin(), nodes_.end(), [](const NodeState& s) { return s.registered; })) {
    return std::vector<Outgoing>{};
  }
  int first = 0;
  for (NodeState& s : nodes_) {
    s.first_ordinal = first;
    first += static_cast<int>(s.info.nprocs);
  }
  phase_ = Phase::kRunning;
  return std::vector<Outgoing>{{Outgoing::kEveryNode, world()}};
}

World JobCoordinator::world() const {
  World w;
  w.job_id = config_.job_id;
  w.torch_port = config_.torch_port;
  w.max_restarts = static_cast<uint32_t>(config_.max_restarts);
  for (const NodeState& s : nodes_) w.nodes.push_back({s.info.nprocs, s.info.hostname, s.info.host_addr});
  w.notice = command_notice();
  return w;
}

// The nodes of one job run one command. Another one is a host's mistake, or a node of another
// job of the same user that came to this master's port: said as the job forms, since
// arguments may differ per node on purpose.
std::string JobCoordinator::command_notice() const {
  const std::string& first = nodes_[0].info.command;
  std::vector<size_t> other;
  for (size_t k = 1; k < nodes_.size(); ++k) {
    if (nodes_[k].info.command != first) other.push_back(k);
  }
  if (other.empty()) return "";
  const NodeState& n = nodes_[other[0]];
  std::string more;
  if (other.size() > 1) more = fmt::format(" ({} more node(s) differ from node 0)", other.size() - 1);
  return fmt::format("node {} (host {}) runs `{}`, node 0 `{}`{}: if that node belongs to "
                     "another job on this port, stop both",
                     other[0], n.info.hostname, n.info.command, first, more);
}

bool JobCoordinator::registered(int node) const {
  return nodes_.at(static_cast<size_t>(node)).registered;
}

int32_t JobCoordinator::registered_pid(int node) const {
  return nodes_.at(static_cast<size_t>(node)).info.pid;
}

int JobCoordinator::finished_node() const {
  if (phase_ != Phase::kRunning) return -1;
  for (size_t k = 0; k < nodes_.size(); ++k) {
    if (nodes_[k].done == 0) return static_cast<int>(k);
  }
  return -1;
}

std::vector<Outgoing> JobCoordinator::on_failed(int node, const Failed& failed,
                                                Clock::time_point now) {
  if (failed.attempt != static_cast<uint32_t>(attempt_)) return {};  // a stale report
  return record(node, failed, now);
}

std::vector<Outgoing> JobCoordinator::record(int node, Failed failed, Clock::time_point now) {
  if (phase_ != Phase::kRunning && phase_ != Phase::kStopping) return {};
  // A failure never ends the job with status 0, whatever a broken node claims (found by
  // fuzz/rendezvous: a Failed with exit code 0 made the job "succeed" with a failure summary).
  if (failed.exit_code == 0) failed.exit_code = kJobFailedExitCode;
  candidates_.push_back({node, std::move(failed)});
  std::vector<Outgoing> out;
  if (phase_ == Phase::kRunning) {
    phase_ = Phase::kStopping;
    stopping_since_ = now;
    const Candidate& first = candidates_.back();
    out.push_back({Outgoing::kEveryNode,
                   Stop{static_cast<uint32_t>(attempt_),
                        fmt::format("{} {}", who(first), first.failed.description)}});
  }
  std::vector<Outgoing> ended = maybe_end_attempt(now);
  out.insert(out.end(), ended.begin(), ended.end());
  return out;
}

std::vector<Outgoing> JobCoordinator::on_attempt_done(int node, const AttemptDone& done,
                                                      Clock::time_point now) {
  if (done.attempt != static_cast<uint32_t>(attempt_) ||
      (phase_ != Phase::kRunning && phase_ != Phase::kStopping)) {
    return {};
  }
  nodes_[static_cast<size_t>(node)].done = done.exit_code;
  nodes_[static_cast<size_t>(node)].finished_first = done.exit_code == 0 && phase_ == Phase::kRunning;
  // After Stop a non-zero end is expected (its replicas were stopped). Before it, a node that
  // ends non-zero without a report is a failure too, though the least likely root cause.
  if (done.exit_code != 0 && phase_ == Phase::kRunning) {
    Failed f;
    f.attempt = done.attempt;
    f.exit_code = done.exit_code;
    f.wall_ns = INT64_MAX;
    f.description = fmt::format("ended its attempt with exit code {} without a report", done.exit_code);
    return record(node, f, now);
  }
  return maybe_end_attempt(now);
}

std::vector<Outgoing> JobCoordinator::on_lost(int node, const std::string& reason, int64_t wall_ns,
                                              Clock::time_point now) {
  NodeState& n = nodes_.at(static_cast<size_t>(node));
  if (phase_ == Phase::kJoining) {
    n.registered = false;  // its launcher may come back and register again
    n.left = fmt::format("node {} (host {}) registered and then left ({})", node, n.info.hostname,
                         reason);
    return {};
  }
  if (n.lost || phase_ == Phase::kEnded) return {};
  n.lost = true;
  Failed f;
  f.attempt = static_cast<uint32_t>(attempt_);
  f.kind = FailureKind::kLost;
  f.exit_code = kJobFailedExitCode;
  f.wall_ns = wall_ns;
  f.description = fmt::format("lost: {}", reason);
  if (n.done) {
    // It had finished its part of the attempt: leaving is no failure of this attempt (a
    // restart needs it, and restartable() refuses one without it).
    return maybe_end_attempt(now);
  }
  return record(node, f, now);
}

JobCoordinator::Absence JobCoordinator::absence() const {
  Absence a;
  for (int k = 0; k < config_.nnodes; ++k) {
    const NodeState& n = nodes_[static_cast<size_t>(k)];
    if (!n.registered) {
      a.missing.push_back(k);
      if (n.left.empty()) {
        a.never.push_back(k);
      } else {
        a.left += fmt::format("{}{}", a.left.empty() ? "" : "; ", n.left);
      }
    } else {
      a.registered.push_back(k);
      a.present += fmt::format("{}node {} (host {}, {})", a.present.empty() ? "" : "; ", k,
                               n.info.hostname, n.info.host_addr);
    }
  }
  return a;
}

std::vector<Outgoing> JobCoordinator::on_tick(Clock::time_point now) {
  if (phase_ != Phase::kJoining || now < joining_deadline_) return {};
  const Absence a = absence();
  std::string absent;
  if (!a.never.empty()) absent = fmt::format("node(s) {} never registered", format_int_ranges(a.never));
  if (!a.left.empty()) absent += fmt::format("{}{}", absent.empty() ? "" : "; ", a.left);
  return end(kJobFailedExitCode,
             fmt::format("xla-spawn: rendezvous timed out after {:.3g} s: {} ({} of {} did{}{})\n",
                         config_.rdzv_timeout.count() / 1000.0, absent,
                         a.registered.size(), config_.nnodes,
                         a.present.empty() ? "" : ": ", a.present));
}

std::string JobCoordinator::status(Clock::time_point now) const {
  switch (phase_) {
    case Phase::kJoining: {
      const Absence a = absence();
      const double left_s =
          std::max(0.0, std::chrono::duration<double>(joining_deadline_ - now).count());
      return fmt::format("{} of {} nodes registered{}; waiting for node(s) {}{}; {:.0f} s left",
                         a.registered.size(), config_.nnodes,
                         a.registered.empty() ? "" : fmt::format(" ({})", format_int_ranges(a.registered)),
                         format_int_ranges(a.missing), a.left.empty() ? "" : fmt::format(" ({})", a.left),
                         left_s);
    }
    case Phase::kRunning:
      return fmt::format("the job formed ({} nodes); attempt {} runs", config_.nnodes, attempt_);
    case Phase::kStopping:
      return fmt::format("the job formed ({} nodes); attempt {} stops after a failure",
                         config_.nnodes, attempt_);
    case Phase::kEnded: break;
  }
  return fmt::format("the job ended with status {}", exit_code_);
}

Clock::time_point JobCoordinator::next_deadline() const {
  return phase_ == Phase::kJoining ? joining_deadline_ : Clock::time_point::max();
}

std::vector<Outgoing> JobCoordinator::maybe_end_attempt(Clock::time_point now) {
  if (phase_ != Phase::kRunning && phase_ != Phase::kStopping) return {};
  for (const NodeState& n : nodes_) {
    if (!n.lost && !n.done) return {};
  }
  if (candidates_.empty()) return end(0, "");
  const Candidate& root = root_cause();
  if (!restartable(root)) return end(root.failed.exit_code, describe(root, now));
  // Every node hears the root cause: a node whose own replica failed as a consequence (its
  // peer's connection reset) may have seen only that.
  std::string cause = describe(root, now);
  ++attempt_;
  candidates_.clear();
  for (NodeState& n : nodes_) {
    n.done.reset();
    n.finished_first = false;
  }
  phase_ = Phase::kRunning;
  attempt_started_ = now;
  stopping_since_ = Clock::time_point::max();
  return {{Outgoing::kEveryNode, Next{static_cast<uint32_t>(attempt_), std::move(cause)}}};
}

std::vector<Outgoing> JobCoordinator::end(int exit_code, std::string summary) {
  phase_ = Phase::kEnded;
  exit_code_ = exit_code;
  summary_ = std::move(summary);
  return {{Outgoing::kEveryNode, End{exit_code_, summary_}}};
}

const JobCoordinator::Candidate& JobCoordinator::root_cause() const {
  XS_CHECK(!candidates_.empty(), "root_cause of an attempt without failures");
  // An interruption after another failure (Ctrl-C while a failing attempt stops) prevents
  // the restart (restartable()) but leaves that failure the root cause, its summary and status.
  int64_t first_other = INT64_MAX;
  for (const Candidate& c : candidates_) {
    if (c.failed.kind != FailureKind::kInterrupted) first_other = std::min(first_other, c.failed.wall_ns);
  }
  const auto rank = [first_other](const Candidate& c) {
    const bool late = c.failed.kind == FailureKind::kInterrupted && c.failed.wall_ns > first_other;
    return std::tuple(late, priority(c.failed.kind), c.failed.wall_ns, c.node);
  };
  return *std::min_element(candidates_.begin(), candidates_.end(),
                           [&rank](const Candidate& a, const Candidate& b) { return rank(a) < rank(b); });
}

bool JobCoordinator::restartable(const Candidate& root) const {
  const bool replica_failed = root.failed.kind == FailureKind::kExited ||
                              root.failed.kind == FailureKind::kSignalled ||
                              root.failed.kind == FailureKind::kLauncherError;
  const bool any_lost =
      std::any_of(nodes_.begin(), nodes_.end(), [](const NodeState& n) { return n.lost; });
  const bool interrupted = std::any_of(candidates_.begin(), candidates_.end(), [](const Candidate& c) {
    return c.failed.kind == FailureKind::kInterrupted;
  });
  return replica_failed && !any_lost && !interrupted && attempt_ < config_.max_restarts;
}

// "ordinal 3 (node 1, host b)" when a replica is to blame, else "node 1 (host b, 198.18.0.2)".
std::string JobCoordinator::who(const Candidate& c) const {
  const NodeState& n = nodes_[static_cast<size_t>(c.node)];
  if (c.failed.local_ordinal >= 0) {
    return fmt::format("ordinal {} (node {}, host {}, local ordinal {})",
                       n.first_ordinal + c.failed.local_ordinal, c.node, n.info.hostname,
                       c.failed.local_ordinal);
  }
  return fmt::format("node {} (host {}, {})", c.node, n.info.hostname, n.info.host_addr);
}

std::string JobCoordinator::describe(const Candidate& root, Clock::time_point now) const {
  // Until the job began to stop, not until the last node was done (the grace period).
  const double elapsed_s =
      std::chrono::duration<double>(std::min(now, stopping_since_) - attempt_started_).count();
  std::string text = fmt::format("xla-spawn: job {} attempt {} failed after {:.2f} s: {} {}\n",
                                 config_.job_id, attempt_, elapsed_s, who(root),
                                 root.failed.description);
  if (root.failed.local_ordinal >= 0 && !root.failed.tail.empty()) {
    const int ordinal = nodes_[static_cast<size_t>(root.node)].first_ordinal + root.failed.local_ordinal;
    text += fmt::format("xla-spawn: last {} line(s) of ordinal {}:\n", root.failed.tail.size(), ordinal);
    for (const std::string& line : root.failed.tail) text += fmt::format("  [{}] {}\n", ordinal, line);
  }
  // 8: enough to see a pattern (every node's echo of one loss) without flooding the console.
  constexpr size_t kMaxOthers = 8;
  size_t shown = 0;
  for (const Candidate& c : candidates_) {
    if (&c == &root || shown == kMaxOthers) continue;
    text += fmt::format("xla-spawn: also: {} {}\n", who(c), c.failed.description);
    ++shown;
  }
  if (candidates_.size() - 1 > shown) {
    text += fmt::format("xla-spawn: also: {} more failure report(s)\n", candidates_.size() - 1 - shown);
  }
  // A node that was done before anything failed did fewer collectives than the others: a hint
  // when a replica failed or a deadline passed, the ways a collective with a missing member
  // ends. Not when a person interrupted (often that very node, whose user stopped waiting), a
  // node was lost or a launcher found corruption: none of those says anything about programs.
  const bool may_be_a_mismatch = root.failed.kind == FailureKind::kExited ||
                                 root.failed.kind == FailureKind::kSignalled ||
                                 root.failed.kind == FailureKind::kTimedOut;
  for (size_t k = 0; k < nodes_.size(); ++k) {
    if (!nodes_[k].finished_first || !may_be_a_mismatch) continue;
    text += fmt::format("xla-spawn: node {} (host {}) had finished, every replica exiting 0, before "
                        "this failure (if that was in a collective, the nodes may have run "
                        "different programs or arguments)\n",
                        k, nodes_[k].info.hostname);
  }
  return text;
}

}  // namespace xs::cluster
