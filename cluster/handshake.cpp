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

ClientProof::ClientProof(Role role) {
  hello_.role = role;
  hello_.nonce = random_nonce();
}

Auth ClientProof::answer(const JobToken& token, const Challenge& challenge) {
  server_nonce_ = challenge.nonce;
  return Auth{token.mac(kClientProof, challenge.nonce, hello_.nonce)};
}

void ClientProof::check(const JobToken& token, const Welcome& welcome,
                        const std::string& peer) const {
  if (!mac_equal(welcome.mac, token.mac(kServerProof, hello_.nonce, server_nonce_))) {
    throw PeerFailure(fmt::format(
        "the rendezvous at {} does not know this job's token (from {}): it belongs to another "
        "job or user",
        peer, token.source()));
  }
}

void client_handshake(Connection& connection, const JobToken& token, Role role,
                      Clock::time_point deadline) {
  ClientProof proof(role);
  connection.send_blocking(proof.hello(), deadline);
  connection.send_blocking(proof.answer(token, expect<Challenge>(connection, deadline)), deadline);
  proof.check(token, expect<Welcome>(connection, deadline), connection.peer());
  connection.set_frame_limit(kMaxFrameBytes);
}

int64_t wall_ns_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace xs::cluster
