#include "xla_spawn/cluster/connection.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <type_traits>

#include <fmt/format.h>

namespace xs::cluster {
namespace {

// Reads grow the input buffer by up to this much at a time.
constexpr size_t kReadChunkBytes = 64 * 1024;

// Control messages are small and latency-bound: send them at once.
void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Fd new_socket(int family, int type) {
  Fd fd(::socket(family, type | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) throw IoError(errno_message("socket", errno));
  return fd;
}

uint32_t frame_length(const std::string& in) {
  uint32_t n = 0;
  for (int i = 3; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(in[static_cast<size_t>(i)]);
  return n;
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

int Fd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string SocketAddress::text() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (storage.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&storage);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    return fmt::format("{}:{}", host, ntohs(a->sin_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
  ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
  return fmt::format("[{}]:{}", host, ntohs(a->sin6_port));
}

namespace {

// getaddrinfo's status for host:port; `address` is set when it is 0.
int lookup(const std::string& host, uint16_t port, SocketAddress& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) return rc;
  if (found == nullptr) return EAI_NONAME;
  std::memcpy(&address.storage, found->ai_addr, found->ai_addrlen);
  address.length = found->ai_addrlen;
  ::freeaddrinfo(found);
  return 0;
}

std::string lookup_error(const std::string& host, uint16_t port, int rc) {
  return fmt::format("cannot resolve '{}' (port {}): {}", host, port, ::gai_strerror(rc));
}

// A name the resolver does not know, or could not look up now: it may know it later (a
// host's DNS record made as the job starts).
bool may_resolve_later(int rc) {
  return rc == EAI_NONAME || rc == EAI_AGAIN || rc == EAI_FAIL || rc == EAI_NODATA;
}

// A DNS name (labels of 1..63 letters, digits, '-' or '_', 253 characters at most, a final
// dot allowed): what could resolve later. "10.0.0.1:29500", "[::1]" or "a b" never will.
bool could_be_host_name(std::string_view host) {
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);
  if (host.empty() || host.size() > 253) return false;
  size_t label = 0;
  for (const char c : host) {
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    if (!ok || ++label > 63) return false;
  }
  return label > 0;
}

}  // namespace

SocketAddress resolve(const std::string& host, uint16_t port) {
  SocketAddress address;
  if (const int rc = lookup(host, port, address); rc != 0) {
    throw InvalidArgument(lookup_error(host, port, rc));
  }
  return address;
}

SocketAddress resolve_by(const std::string& host, uint16_t port, Clock::time_point deadline,
                         std::chrono::milliseconds retry,
                         const std::function<void(const std::string&)>& on_first_failure) {
  SocketAddress address;
  for (bool first = true;; first = false) {
    const int rc = lookup(host, port, address);
    if (rc == 0) return address;
    const std::string error = lookup_error(host, port, rc);
    if (!could_be_host_name(host)) {
      throw InvalidArgument(fmt::format("{}: '{}' is neither a host name nor an address (an "
                                        "IPv6 address goes without brackets, the port apart)",
                                        error, host));
    }
    if (!may_resolve_later(rc)) throw InvalidArgument(error);
    const Clock::time_point now = Clock::now();
    if (now >= deadline) throw Timeout(error);
    if (first) on_first_failure(error);
    sleep_until(std::min(now + retry, deadline));
  }
}

Fd listen_on(const std::string& host, uint16_t port) {
  const SocketAddress address = resolve(host, port);
  Fd fd = new_socket(address.storage.ss_family, SOCK_STREAM);
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0) {
    throw IoError(errno_message(fmt::format("cannot listen on {}: bind", address.text()), errno));
  }
  // 4096: the whole job's launchers and replicas may connect at once (the kernel caps it at
  // net.core.somaxconn).
  if (::listen(fd.get(), 4096) != 0) {
    throw IoError(errno_message(fmt::format("cannot listen on {}", address.text()), errno));
  }
  set_nonblocking(fd.get());
  return fd;
}

uint16_t bound_port(int fd) {
  sockaddr_storage storage{};
  socklen_t length = sizeof storage;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&storage), &length) != 0) {
    throw IoError(errno_message("getsockname", errno));
  }
  return storage.ss_family == AF_INET
             ? ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port)
             : ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
}

std::string local_address_towards(const std::string& host, uint16_t port) {
  const SocketAddress target = resolve(host, port);
  Fd fd = new_socket(target.storage.ss_family, SOCK_DGRAM);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&target.storage), target.length) != 0) {
    throw IoError(errno_message(fmt::format("no route to {}", target.text()), errno));
  }
  SocketAddress self;
  self.length = sizeof self.storage;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&self.storage), &self.length) != 0) {
    throw IoError(errno_message("getsockname", errno));
  }
  const std::string text = self.text();  // "addr:port" or "[addr]:port": drop the port
  const std::string host_part = text.substr(0, text.rfind(':'));
  return host_part.front() == '[' ? host_part.substr(1, host_part.size() - 2) : host_part;
}

uint16_t pick_free_port(const std::string& host) {
  const Fd fd = listen_on(host, 0);
  return bound_port(fd.get());
}

Connection::Connection(Fd fd, std::string peer) : fd_(std::move(fd)), peer_(std::move(peer)) {
  set_nonblocking(fd_.get());
  set_nodelay(fd_.get());
}

bool Connection::read_some() {
  for (;;) {
    const size_t old = in_.size();
    in_.resize(old + kReadChunkBytes);
    const ssize_t n = ::recv(fd_.get(), in_.data() + old, kReadChunkBytes, 0);
    in_.resize(old + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n == 0) return false;
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      if (errno == ECONNRESET) return false;
      throw IoError(errno_message(fmt::format("read from {}", peer_), errno));
    }
    if (in_.size() >= 4 && frame_length(in_) > frame_limit_) {
      throw ProtocolError(fmt::format("frame of {} bytes from {} is above the limit of {} bytes",
                                      frame_length(in_), peer_, frame_limit_));
    }
    if (static_cast<size_t>(n) < kReadChunkBytes) return true;
  }
}

std::optional<Message> Connection::next() {
  if (in_.size() < 4) return std::nullopt;
  const uint32_t n = frame_length(in_);
  if (n > frame_limit_) {
    throw ProtocolError(fmt::format("frame of {} bytes from {} is above the limit of {} bytes", n,
                                    peer_, frame_limit_));
  }
  if (in_.size() < 4 + static_cast<size_t>(n)) return std::nullopt;
  Message message = decode(std::string_view(in_).substr(4, n));
  in_.erase(0, 4 + static_cast<size_t>(n));
  return message;
}

void Connection::send(const Message& message) {
  if (sent_ == out_.size()) {
    out_.clear();
    sent_ = 0;
  }
  out_ += encode_frame(message);
  flush();
}

bool Connection::flush() {
  while (sent_ < out_.size()) {
    const ssize_t n = ::send(fd_.get(), out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      if (errno == EPIPE || errno == ECONNRESET) {
        throw ConnectionClosed(fmt::format("{} closed the connection", peer_));
      }
      throw IoError(errno_message(fmt::format("write to {}", peer_), errno));
    }
    sent_ += static_cast<size_t>(n);
  }
  return true;
}

void Connection::wait_ready(short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    pollfd p{fd_.get(), events, 0};
    const int ready = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (ready > 0) return;
    if (ready < 0 && errno != EINTR) throw IoError(errno_message("poll", errno));
    if (ready == 0 && Clock::now() >= deadline) {
      throw Timeout(fmt::format("{} {}: no progress before the deadline", what, peer_));
    }
  }
}

void Connection::send_blocking(const Message& message, Clock::time_point deadline) {
  send(message);
  while (!flush()) wait_ready(POLLOUT, deadline, "writing to");
}

Message Connection::receive_blocking(Clock::time_point deadline) {
  for (;;) {
    if (std::optional<Message> m = next()) return std::move(*m);
    wait_ready(POLLIN, deadline, "waiting for a reply from");
    if (read_some()) continue;
    if (std::optional<Message> m = next()) return std::move(*m);
    throw ConnectionClosed(fmt::format("{} closed the connection", peer_));
  }
}

Connection connect_to(const std::string& host, uint16_t port, Clock::time_point deadline,
                      std::chrono::milliseconds retry) {
  return connect_to(resolve(host, port), deadline, retry);
}

Connection connect_to(const SocketAddress& address, Clock::time_point deadline,
                      std::chrono::milliseconds retry) {
  std::string last_error = "no attempt";
  for (;;) {
    int error = 0;
    Fd fd = start_connect(address, error);
    if (error == 0) {
      pollfd p{fd.get(), POLLOUT, 0};
      int ready;
      while ((ready = ::poll(&p, 1, poll_timeout_ms(deadline))) < 0 && errno == EINTR) {
      }
      error = ready > 0 ? connect_error(fd.get()) : ETIMEDOUT;
    }
    if (error == 0) return Connection(std::move(fd), address.text());
    last_error = std::strerror(error);
    if (Clock::now() + retry >= deadline) {
      throw Timeout(fmt::format("cannot connect to {}: {}", address.text(), last_error));
    }
    sleep_until(Clock::now() + retry);  // the listener may not be up yet: retry, bounded
  }
}

Fd start_connect(const SocketAddress& address, int& error) {
  Fd fd = new_socket(address.storage.ss_family, SOCK_STREAM);
  set_nonblocking(fd.get());
  const int rc =
      ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length);
  error = rc == 0 || errno == EINPROGRESS ? 0 : errno;
  return fd;
}

int connect_error(int fd) {
  int error = 0;
  socklen_t length = sizeof error;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) return errno;
  return error;
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    throw IoError(errno_message("fcntl(O_NONBLOCK)", errno));
  }
}

void sleep_until(Clock::time_point t) {
  static_assert(std::is_same_v<Clock, std::chrono::steady_clock>);  // CLOCK_MONOTONIC
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  if (ns <= 0) return;
  const timespec at{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, nullptr) == EINTR) {
  }
}

int poll_timeout_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
}

}  // namespace xs::cluster
