#include "xla_spawn/cluster/liveness_probe.h"

#include <poll.h>
#include <sys/epoll.h>

#include <optional>

#include <fmt/format.h>

#include "xla_spawn/cluster/handshake.h"

namespace xs::cluster {
namespace {

// Sockets a probe holds at most (a slow link's attempts overlap).
constexpr size_t kMaxAttempts = 16;

}  // namespace

struct LivenessProbe::Attempt {
  enum class Stage { kConnecting, kChallenge, kWelcome, kAnswer };
  Attempt(Fd fd, const SocketAddress& master, Clock::time_point give_up)
      : connection(std::move(fd), master.text()), proof(Role::kNode), give_up(give_up) {}
  Connection connection;
  ClientProof proof;
  Stage stage = Stage::kConnecting;
  Clock::time_point give_up;
  uint32_t watching = EPOLLOUT;  // its events in the epoll set
};

LivenessProbe::LivenessProbe(SocketAddress master, JobToken token, Alive alive,
                             std::chrono::milliseconds every, std::chrono::milliseconds patience,
                             int epoll_fd)
    : master_(master),
      token_(std::move(token)),
      alive_(alive),
      every_(every),
      patience_(patience),
      epoll_fd_(epoll_fd) {}

// Closing an attempt's socket takes it out of the epoll set.
LivenessProbe::~LivenessProbe() = default;

LivenessProbe::Result LivenessProbe::step(Clock::time_point now) {
  for (size_t i = 0; i < attempts_.size();) {
    Attempt& attempt = *attempts_[i];
    std::optional<Result> result;
    try {
      result = advance(attempt);  // an answer already in, however late, still counts
    } catch (const Error&) {
      // Closed, reset, a protocol error or another job's server: this attempt is over.
    }
    if (result == Result::kWaiting && now >= attempt.give_up) result.reset();
    if (result == Result::kWaiting) {
      ++i;
      continue;
    }
    if (result) {
      attempts_.clear();
      return *result;
    }
    last_failure_ = now;
    attempts_.erase(attempts_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  if (now >= next_attempt_) {
    next_attempt_ = now + every_;
    if (attempts_.size() < kMaxAttempts) start(now);
  }
  return Result::kWaiting;
}

Clock::time_point LivenessProbe::deadline() const {
  Clock::time_point next = next_attempt_;
  for (const auto& attempt : attempts_) next = std::min(next, attempt->give_up);
  return next;
}

void LivenessProbe::start(Clock::time_point now) {
  int error = 0;
  Fd fd = start_connect(master_, error);
  if (error != 0) {  // no route yet: the next attempt tries again
    last_failure_ = now;
    return;
  }
  attempts_.push_back(std::make_unique<Attempt>(std::move(fd), master_, now + patience_));
  const Attempt& attempt = *attempts_.back();
  epoll_event ev{};
  ev.events = EPOLLOUT;  // writable once connected (or failed)
  ev.data.fd = attempt.connection.fd();
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ev.data.fd, &ev) != 0) {
    throw IoError(errno_message("epoll_ctl(probe)", errno));
  }
}

void LivenessProbe::watch(Attempt& attempt, uint32_t events) {
  if (events == attempt.watching) return;
  attempt.watching = events;
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = attempt.connection.fd();
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, ev.data.fd, &ev);
}

std::optional<LivenessProbe::Result> LivenessProbe::advance(Attempt& attempt) {
  using Stage = Attempt::Stage;
  Connection& c = attempt.connection;
  if (attempt.stage == Stage::kConnecting) {
    pollfd p{c.fd(), POLLOUT, 0};
    if (::poll(&p, 1, 0) != 1) return Result::kWaiting;
    if (connect_error(c.fd()) != 0) return std::nullopt;
    attempt.stage = Stage::kChallenge;
    c.send(attempt.proof.hello());
  }
  const bool open = c.read_some();
  while (std::optional<Message> m = c.next()) {
    if (attempt.stage == Stage::kChallenge && std::holds_alternative<Challenge>(*m)) {
      c.send(attempt.proof.answer(token_, std::get<Challenge>(*m)));
      attempt.stage = Stage::kWelcome;
    } else if (attempt.stage == Stage::kWelcome && std::holds_alternative<Welcome>(*m)) {
      attempt.proof.check(token_, std::get<Welcome>(*m), c.peer());
      c.set_frame_limit(kMaxFrameBytes);
      c.send(alive_);
      attempt.stage = Stage::kAnswer;
    } else if (attempt.stage == Stage::kAnswer && std::holds_alternative<Heartbeat>(*m)) {
      return Result::kAlive;
    } else if (attempt.stage == Stage::kAnswer && std::holds_alternative<ErrorReply>(*m)) {
      refusal_ = std::get<ErrorReply>(*m).message;
      return Result::kRefused;
    } else {
      return std::nullopt;  // a refused handshake (too many connections), or not a master
    }
  }
  if (!open) return std::nullopt;
  watch(attempt, EPOLLIN | (c.wants_write() && !c.flush() ? EPOLLOUT : 0u));
  return Result::kWaiting;
}

}  // namespace xs::cluster
