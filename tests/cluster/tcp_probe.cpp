// A tiny TCP endpoint for the namespace cluster tests. `listen` serves N connections one
// after another: it reads each to end of file and answers "<its hostname> <bytes read>".
// `connect` sends a payload, half-closes, and prints that answer and how long it took.
//
//   tcp_probe listen ADDR PORT [--accept N] [--timeout-ms T]    prints "listening" when ready
//   tcp_probe connect ADDR PORT [--send-bytes N] [--timeout-ms T]
//       prints "<hostname> <bytes> <seconds from connect to answer>"
//
// T (default 5000) bounds the whole run. Exit 0 on success; 1 with a message naming the
// address and what failed or timed out; 2 on bad arguments.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string mode, addr;
  uint16_t port = 0;
  long accept = 1;
  long send_bytes = 0;
  long timeout_ms = 5000;
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "tcp_probe: %s\n", what.c_str());
  std::exit(1);
}

[[noreturn]] void fail_errno(const std::string& what) {
  fail(what + ": " + std::strerror(errno));
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "tcp_probe: %s\nusage: tcp_probe listen ADDR PORT [--accept N] [--timeout-ms T]\n"
               "       tcp_probe connect ADDR PORT [--send-bytes N] [--timeout-ms T]\n",
               why.c_str());
  std::exit(2);
}

long parse_number(const std::string& flag, const char* text, long min, long max) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < min || value > max) {
    usage(flag + " '" + text + "': expected " + std::to_string(min) + ".." + std::to_string(max));
  }
  return value;
}

Options parse(int argc, char** argv) {
  if (argc < 4) usage("expected a mode, an address and a port");
  Options o;
  o.mode = argv[1];
  o.addr = argv[2];
  o.port = static_cast<uint16_t>(parse_number("PORT", argv[3], 1, 65535));
  if (o.mode != "listen" && o.mode != "connect") usage("mode '" + o.mode + "'");
  for (int i = 4; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    if (flag == "--accept" && o.mode == "listen") {
      o.accept = parse_number(flag, argv[i + 1], 1, 1024);
    } else if (flag == "--send-bytes" && o.mode == "connect") {
      o.send_bytes = parse_number(flag, argv[i + 1], 0, 1L << 32);
    } else if (flag == "--timeout-ms") {
      o.timeout_ms = parse_number(flag, argv[i + 1], 1, 3600 * 1000);
    } else {
      usage("unknown flag '" + flag + "' for " + o.mode);
    }
  }
  return o;
}

sockaddr_in socket_address(const Options& o) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(o.port);
  if (::inet_pton(AF_INET, o.addr.c_str(), &sa.sin_addr) != 1) usage("address '" + o.addr + "'");
  return sa;
}

std::string endpoint(const Options& o) {
  return o.addr + ":" + std::to_string(o.port);
}

// Waits until `fd` is ready for `events` or fails naming `what` once `deadline` passes.
void wait_ready(int fd, short events, Clock::time_point deadline, const std::string& what) {
  while (true) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) fail(what + ": timed out");
    pollfd p{fd, events, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready > 0) return;
    if (ready < 0 && errno != EINTR) fail_errno(what + ": poll");
  }
}

int nonblocking_socket() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) fail_errno("socket");
  return fd;
}

// Reads `fd` to end of file; returns the byte count and, in `text`, up to 256 bytes.
uint64_t read_all(int fd, Clock::time_point deadline, const std::string& what,
                  std::string* text = nullptr) {
  char buffer[65536];
  uint64_t total = 0;
  while (true) {
    wait_ready(fd, POLLIN, deadline, what);
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n == 0) return total;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      fail_errno(what);
    }
    total += static_cast<uint64_t>(n);
    if (text != nullptr && text->size() < 256) text->append(buffer, static_cast<size_t>(n));
  }
}

void write_all(int fd, const char* data, size_t size, Clock::time_point deadline,
               const std::string& what) {
  while (size > 0) {
    wait_ready(fd, POLLOUT, deadline, what);
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      fail_errno(what);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

std::string own_hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) fail_errno("gethostname");
  return name;
}

int serve(const Options& o, Clock::time_point deadline) {
  const int listener = nonblocking_socket();
  const int one = 1;
  if (::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) {
    fail_errno("setsockopt SO_REUSEADDR");
  }
  const sockaddr_in sa = socket_address(o);
  if (::bind(listener, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    fail_errno("bind " + endpoint(o));
  }
  if (::listen(listener, 1024) != 0) fail_errno("listen " + endpoint(o));
  std::printf("listening %s\n", endpoint(o).c_str());
  std::fflush(stdout);
  const std::string hostname = own_hostname();
  for (long served = 0; served < o.accept; ++served) {
    const std::string what = "connection " + std::to_string(served + 1) + " of " +
                             std::to_string(o.accept) + " on " + endpoint(o);
    wait_ready(listener, POLLIN, deadline, "accept " + what);
    const int conn = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn < 0) fail_errno("accept " + what);
    const uint64_t received = read_all(conn, deadline, "read " + what);
    const std::string answer = hostname + " " + std::to_string(received) + "\n";
    write_all(conn, answer.data(), answer.size(), deadline, "answer " + what);
    ::close(conn);
  }
  return 0;
}

int probe(const Options& o, Clock::time_point deadline) {
  const int fd = nonblocking_socket();
  const sockaddr_in sa = socket_address(o);
  const auto start = Clock::now();
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0 &&
      errno != EINPROGRESS) {
    fail_errno("connect " + endpoint(o));
  }
  wait_ready(fd, POLLOUT, deadline, "connect " + endpoint(o));
  int error = 0;
  socklen_t length = sizeof error;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) fail_errno("getsockopt");
  if (error != 0) fail("connect " + endpoint(o) + ": " + std::strerror(error));
  const std::vector<char> chunk(65536, 'x');
  for (long left = o.send_bytes; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<long>(left, static_cast<long>(chunk.size())));
    write_all(fd, chunk.data(), n, deadline, "send to " + endpoint(o));
    left -= static_cast<long>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string answer;
  read_all(fd, deadline, "read the answer of " + endpoint(o), &answer);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (answer.empty() || answer.back() != '\n') fail("incomplete answer from " + endpoint(o));
  answer.pop_back();
  std::printf("%s %.3f\n", answer.c_str(), seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const auto deadline = Clock::now() + std::chrono::milliseconds(o.timeout_ms);
  return o.mode == "listen" ? serve(o, deadline) : probe(o, deadline);
}
