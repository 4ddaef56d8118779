#pragma once
// The job as the master sees it: which nodes have registered, the world once all have, the
// failures of each attempt, and the decision that ends an attempt (restart every node, or
// end the job with the root cause's exit status). Pure logic without sockets: the
// rendezvous server (cluster/rendezvous_server.h) feeds it events and sends what it returns,
// so every rule here is tested without a network.
//
//   xs::cluster::JobCoordinator job({.nnodes = 2, .max_restarts = 1, .job_id = "xs-1-2"}, now);
//   auto reply = job.on_register(reg, now);      // a refusal, or messages to send
//   for (const Outgoing& o : job.on_failed(1, failed, now)) send(o.node, o.message);
//
// Rules. Registration is open until every node has registered or the rendezvous deadline
// passes; a node index outside the job, a second claim on a taken index or a different
// --nnodes is refused. The first failure of an attempt sends Stop to every node at once;
// later reports are only collected. The attempt ends when every node that is still
// connected has sent AttemptDone; then the root cause is chosen among everything collected:
// first a node's timeout or interruption (a person or a deadline acted), then a lost node,
// a replica killed by a signal, or a corrupted segment, then a replica's non-zero exit
// (which may be a peer's echo: replicas whose peer vanished exit 1), each class by the
// earliest wall-clock time. The job restarts (Next to every node) when restarts are left,
// no node was lost and the root cause is a replica's failure; otherwise End carries the
// exit status and the summary to every node.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "xla_spawn/cluster/wire.h"

namespace xs::cluster {

using Clock = std::chrono::steady_clock;

// What every node exits with when the root cause is a lost node or a failed rendezvous.
inline constexpr int kJobFailedExitCode = 1;

struct CoordinatorConfig {
  int nnodes = 1;
  int max_restarts = 0;
  std::chrono::milliseconds rdzv_timeout{300'000};
  uint32_t torch_port = 0;
  std::string job_id;
};

// A message for one node, or for every connected node when node is kEveryNode.
struct Outgoing {
  static constexpr int kEveryNode = -1;
  int node = kEveryNode;
  Message message;
};

class JobCoordinator {
 public:
  enum class Phase { kJoining, kRunning, kStopping, kEnded };

  JobCoordinator(CoordinatorConfig config, Clock::time_point now);

  // The refusal (the server sends it as ErrorReply and closes), or the messages to send: World
  // to everyone once the last node registers.
  std::variant<std::string, std::vector<Outgoing>> on_register(const Register& reg);
  std::vector<Outgoing> on_failed(int node, const Failed& failed, Clock::time_point now);
  std::vector<Outgoing> on_attempt_done(int node, const AttemptDone& done, Clock::time_point now);
  // The node's connection closed or fell silent (`reason` says which); `wall_ns` is now.
  std::vector<Outgoing> on_lost(int node, const std::string& reason, int64_t wall_ns,
                                Clock::time_point now);
  // Deadlines: the rendezvous timeout while joining.
  std::vector<Outgoing> on_tick(Clock::time_point now);
  Clock::time_point next_deadline() const;
  // One line on where the job stands, for the master's console: while joining, the nodes
  // that have registered and those awaited ("2 of 3 nodes registered (0-1); waiting for
  // node(s) 2; 277 s left"); later, the attempt and its phase.
  std::string status(Clock::time_point now) const;

  Phase phase() const { return phase_; }
  int attempt() const { return attempt_; }
  bool registered(int node) const;
  // The pid node `node`'s launcher last registered with (kept after it leaves); 0 if none.
  int32_t registered_pid(int node) const;
  // A node whose replicas all exited 0 in the running attempt while other nodes run on, or -1.
  // Every store key a replica waits for needs every node (each gloo mesh spans them all), so
  // such a wait can no longer end: the store fails it at once, naming this node.
  int finished_node() const;
  // After kEnded: what every node was told.
  int exit_code() const { return exit_code_; }
  const std::string& summary() const { return summary_; }

 private:
  struct NodeState {
    bool registered = false;
    std::string left;  // while joining: why a node that had registered went away
    bool lost = false;
    std::optional<int32_t> done;  // AttemptDone's exit code for the current attempt
    bool finished_first = false;  // done with 0 before the attempt's first failure
    Register info;
    int first_ordinal = 0;
  };
  struct Candidate {
    int node = 0;
    Failed failed;
  };

  // While joining: the registered nodes (and as text), the others, those of them that never
  // registered ("node(s) 2-3 never registered"), and the ones that registered and left.
  struct Absence {
    std::vector<int> registered;
    std::vector<int> missing;
    std::vector<int> never;
    std::string left;
    std::string present;
  };
  Absence absence() const;
  std::vector<Outgoing> record(int node, Failed failed, Clock::time_point now);
  std::string command_notice() const;
  std::vector<Outgoing> maybe_end_attempt(Clock::time_point now);
  std::vector<Outgoing> end(int exit_code, std::string summary);
  const Candidate& root_cause() const;
  bool restartable(const Candidate& root) const;
  std::string who(const Candidate& c) const;
  std::string describe(const Candidate& root, Clock::time_point now) const;
  World world() const;

  CoordinatorConfig config_;
  Phase phase_ = Phase::kJoining;
  Clock::time_point joining_deadline_;
  Clock::time_point attempt_started_;
  Clock::time_point stopping_since_ = Clock::time_point::max();  // the attempt's first failure
  int attempt_ = 0;
  std::vector<NodeState> nodes_;
  std::vector<Candidate> candidates_;  // failures of the current attempt, in arrival order
  int exit_code_ = 0;
  std::string summary_;
};

}  // namespace xs::cluster
