#pragma once
// The client's side of the rendezvous handshake (cluster/wire.h): Hello, the server's
// Challenge, Auth with the job token's MAC over both nonces, and the server's Welcome, whose
// MAC proves the server knows the token too. The server's side is in rendezvous_server.cpp.
//
//   xs::cluster::Connection c = xs::cluster::connect_to(addr, port, deadline);
//   xs::cluster::client_handshake(c, token, xs::cluster::Role::kNode, deadline);

#include <string>

#include "xla_spawn/cluster/connection.h"
#include "xla_spawn/cluster/job_token.h"
#include "xla_spawn/cluster/wire.h"

namespace xs::cluster {

// MAC purposes: the client proves first, over (server nonce, client nonce); the server
// proves back over the nonces in the other order, so one answer is never valid for the other.
inline constexpr const char* kClientProof = "xla-spawn rendezvous client";
inline constexpr const char* kServerProof = "xla-spawn rendezvous server";

// The same steps for a caller that cannot block (cluster/liveness_probe.h):
//
//   xs::cluster::ClientProof proof(xs::cluster::Role::kNode);
//   connection.send(proof.hello());
//   // on Challenge:
//   connection.send(proof.answer(token, challenge));
//   // on Welcome:
//   proof.check(token, welcome, connection.peer());   // PeerFailure: another job's server
class ClientProof {
 public:
  explicit ClientProof(Role role);
  const Hello& hello() const { return hello_; }
  Auth answer(const JobToken& token, const Challenge& challenge);
  void check(const JobToken& token, const Welcome& welcome, const std::string& peer) const;

 private:
  Hello hello_;
  Nonce server_nonce_{};
};

// Throws PeerFailure with the server's own words when it refuses (wrong token, version),
// PeerFailure when the server cannot prove the token, Timeout/IoError from the connection.
void client_handshake(Connection& connection, const JobToken& token, Role role,
                      Clock::time_point deadline);

// The server's refusal as an exception message: "the rendezvous at ADDR refused: WHY".
[[noreturn]] void throw_refusal(const Connection& connection, const ErrorReply& reply);

// CLOCK_REALTIME in nanoseconds: comparable across hosts whose clocks are synchronised.
int64_t wall_ns_now();

}  // namespace xs::cluster
