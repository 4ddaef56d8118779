#pragma once
// TCP plumbing for the rendezvous: addresses, a listening socket bound to exactly one
// address, and a Connection that sends and receives whole frames (cluster/wire.h). Its
// non-blocking calls serve event loops (the rendezvous server, the launcher's poll loop);
// its blocking calls, each with a deadline, serve request-reply clients.
//
//   xs::cluster::Connection c = xs::cluster::connect_to("198.18.0.1", 29500, deadline);
//   c.send_blocking(xs::cluster::Hello{...}, deadline);
//   xs::cluster::Message reply = c.receive_blocking(deadline);   // Timeout past the deadline
//
// Frames longer than the connection's limit are a ProtocolError as soon as their length
// prefix arrives: nothing is buffered for them.

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "xla_spawn/cluster/wire.h"

namespace xs::cluster {

using Clock = std::chrono::steady_clock;

// The peer closed the connection (or reset it: a peer killed with unread data in its socket
// resets rather than closes): the same event, reported the same way.
class ConnectionClosed : public IoError {
 public:
  using IoError::IoError;
};

// Owns a file descriptor; closes it once.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release();
  void reset();

 private:
  int fd_ = -1;
};

// A resolved IPv4 or IPv6 socket address.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  std::string text() const;  // "198.18.0.1:29500", "[::1]:29500"
};

// Resolves `host` (a numeric address or a name) and `port`; InvalidArgument naming both
// when it does not resolve.
SocketAddress resolve(const std::string& host, uint16_t port);
// resolve, retried every `retry` until `deadline` while the resolver does not know the name
// or cannot look it up now (a node may start before its master's name is in DNS);
// `on_first_failure` hears the first failure's message. Timeout with that message at the
// deadline; InvalidArgument at once for an error no retry can mend.
SocketAddress resolve_by(const std::string& host, uint16_t port, Clock::time_point deadline,
                         std::chrono::milliseconds retry,
                         const std::function<void(const std::string&)>& on_first_failure);

// A non-blocking listening socket bound to exactly `host`:`port` (never the wildcard
// address): IoError naming the address when bind fails (e.g. the port is in use).
Fd listen_on(const std::string& host, uint16_t port);
// The port a listening socket is bound to (for port 0: the one the kernel chose).
uint16_t bound_port(int fd);
// The local address this host uses to reach `host`: a UDP socket is connected (which sends
// nothing) and asked for its own address. This is where the node's replicas listen.
std::string local_address_towards(const std::string& host, uint16_t port);
// A TCP port on `host` that was free a moment ago (bound, read, closed).
uint16_t pick_free_port(const std::string& host);

class Connection {
 public:
  Connection(Fd fd, std::string peer);
  int fd() const { return fd_.get(); }
  const std::string& peer() const { return peer_; }  // "198.18.0.2:41234"
  // The largest frame body accepted from the peer (kMaxUnauthenticatedFrameBytes until the
  // peer has authenticated).
  void set_frame_limit(size_t bytes) { frame_limit_ = bytes; }

  // Non-blocking. read_some() reads what the socket has: false at EOF or reset; IoError on
  // another socket error; ProtocolError when a frame's length prefix exceeds the limit.
  bool read_some();
  // The next whole message read so far, decoded (ProtocolError if it does not parse).
  std::optional<Message> next();
  // Queues the frame and writes what the socket takes now; flush() writes more later.
  void send(const Message& message);
  // Writes queued bytes; true when none are left. ConnectionClosed when the peer is gone,
  // IoError on another error.
  bool flush();
  bool wants_write() const { return sent_ < out_.size(); }

  // Blocking, with a deadline: Timeout when it passes, IoError when the peer closes.
  void send_blocking(const Message& message, Clock::time_point deadline);
  Message receive_blocking(Clock::time_point deadline);

 private:
  void wait_ready(short events, Clock::time_point deadline, const char* what);

  Fd fd_;
  std::string peer_;
  size_t frame_limit_ = kMaxUnauthenticatedFrameBytes;
  std::string in_;
  std::string out_;
  size_t sent_ = 0;  // bytes of out_ already written
};

// Connects to host:port by `deadline`, retrying refused or unreachable attempts every
// `retry` (the other side may not be listening yet). Timeout names the address and the last
// error; InvalidArgument when the address does not resolve.
Connection connect_to(const std::string& host, uint16_t port, Clock::time_point deadline,
                      std::chrono::milliseconds retry = std::chrono::milliseconds(200));
Connection connect_to(const SocketAddress& address, Clock::time_point deadline,
                      std::chrono::milliseconds retry = std::chrono::milliseconds(200));
// A non-blocking connect to `address`, started: the socket, and in `error` 0 (connected or
// under way: poll for POLLOUT, then ask connect_error) or the errno of an immediate failure.
Fd start_connect(const SocketAddress& address, int& error);
// The outcome of a connect that was under way once its socket is writable: 0 or an errno.
int connect_error(int fd);

// Milliseconds from now until `deadline`, clamped to [0, INT_MAX] for poll().
int poll_timeout_ms(Clock::time_point deadline);
// O_NONBLOCK on `fd`; IoError when fcntl fails.
void set_nonblocking(int fd);
// Sleeps until `t`, however many signals cut the sleep short: on an absolute deadline, since
// the restart of a relative sleep (std::this_thread::sleep_for) from its remaining time let
// a flood of SIGUSR1 stretch a 500 ms retry pause to seconds.
void sleep_until(Clock::time_point t);

}  // namespace xs::cluster
