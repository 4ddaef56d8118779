#include "xla_spawn/cluster/handshake.h"

#include <ctime>

#include <fmt/format.h>

namespace xs::cluster {
namespace {

// The next message, or the server's refusal thrown; anything else is a protocol error.
template <typename T>
T expect(Connection& connection, Clock::time_point deadline) {
  Message m = connection.receive_blocking(deadline);
  if (auto* refusal = std::get_if<ErrorReply>(&m)) throw_refusal(connection, *refusal);
  if (auto* wanted = std::get_if<T>(&m)) return std::move(*wanted);
  throw ProtocolError(fmt::format("rendezvous at {} sent {} during the handshake",
                                  connection.peer(), message_name(m)));
}

}  // namespace

void throw_refusal(const Connection& connection, const ErrorReply& reply) {
  throw PeerFailure(fmt::format("the rendezvous at {} refused: {}", connection.peer(), reply.message));
}

void client_handshake(Connection& connection, const JobToken& token, Role role,
                      Clock::time_point deadline) {
  Hello hello;
  hello.role = role;
  hello.nonce = random_nonce();
  connection.send_blocking(hello, deadline);
  const Challenge challenge = expect<Challenge>(connection, deadline);
  connection.send_blocking(Auth{token.mac(kClientProof, challenge.nonce, hello.nonce)}, deadline);
  const Welcome welcome = expect<Welcome>(connection, deadline);
  if (!mac_equal(welcome.mac, token.mac(kServerProof, hello.nonce, challenge.nonce))) {
    throw PeerFailure(fmt::format(
        "the rendezvous at {} does not know this job's token (from {}): it belongs to another "
        "job or user",
        connection.peer(), token.source()));
  }
  connection.set_frame_limit(kMaxFrameBytes);
}

int64_t wall_ns_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace xs::cluster
