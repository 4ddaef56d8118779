#pragma once
// A node's proof of life over new connections, for when its connection to the master has
// fallen silent. After a network outage TCP resends on an established connection only when
// its backed-off retransmission timer fires, which can be as long again as the outage: an
// outage of 3.5 s went unheard past the default 5 s heartbeat timeout. A new connection's
// first packet leaves at once. So while the link is silent, the probe opens a connection
// every `every` (each given `patience` to be answered), authenticates it with the job token
// and sends Alive{node, pid}. The master counts that as the node's heartbeat and answers with
// one, which the node counts as the master's; or it answers why it no longer counts the node.
//
//   xs::cluster::LivenessProbe probe(master, token, {node, pid}, every, patience, epoll_fd);
//   // whenever epoll_fd is readable or probe.deadline() has passed:
//   switch (probe.step(xs::cluster::Clock::now())) {
//     case xs::cluster::LivenessProbe::Result::kAlive: ...     // the master heard this node
//     case xs::cluster::LivenessProbe::Result::kRefused: ...   // probe.refusal() says why
//     case xs::cluster::LivenessProbe::Result::kWaiting: ...
//   }

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "xla_spawn/cluster/connection.h"
#include "xla_spawn/cluster/job_token.h"
#include "xla_spawn/cluster/wire.h"

namespace xs::cluster {

class LivenessProbe {
 public:
  enum class Result { kWaiting, kAlive, kRefused };

  // `epoll_fd`: an epoll instance the attempts' sockets join while they wait, so that a poll
  // on it wakes the caller when one can move on.
  LivenessProbe(SocketAddress master, JobToken token, Alive alive, std::chrono::milliseconds every,
                std::chrono::milliseconds patience, int epoll_fd);
  ~LivenessProbe();
  LivenessProbe(const LivenessProbe&) = delete;
  LivenessProbe& operator=(const LivenessProbe&) = delete;

  // Starts an attempt when one is due and moves every attempt on as far as it can without
  // blocking. An attempt that fails (no route, refused, closed, too slow) is dropped: the
  // next one tries again.
  Result step(Clock::time_point now);
  // When step() must run again at the latest.
  Clock::time_point deadline() const;
  // After kRefused: the master's words.
  const std::string& refusal() const { return refusal_; }
  // When an attempt last failed (no route, refused, closed, unanswered in time): the link or
  // the master was down then. Clock::time_point::min() when none has.
  Clock::time_point last_failure() const { return last_failure_; }

 private:
  struct Attempt;
  void start(Clock::time_point now);
  // The attempt's result, or nullopt when it failed.
  std::optional<Result> advance(Attempt& attempt);
  void watch(Attempt& attempt, uint32_t events);

  SocketAddress master_;
  JobToken token_;
  Alive alive_;
  std::chrono::milliseconds every_;
  std::chrono::milliseconds patience_;
  int epoll_fd_;
  std::vector<std::unique_ptr<Attempt>> attempts_;
  Clock::time_point next_attempt_ = Clock::time_point::min();
  std::string refusal_;
  Clock::time_point last_failure_ = Clock::time_point::min();
};

}  // namespace xs::cluster
