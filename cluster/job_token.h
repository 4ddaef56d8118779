#pragma once
// The job token: a secret shared by every node of a multi-node job, so that only the job's
// own launchers and replicas can join its rendezvous. A connection proves that it knows the
// token with a keyed MAC (SipHash-2-4) over two fresh nonces, one from each side, and the
// server proves it back; the token itself never crosses the network. Where it comes from,
// first match wins:
//   XLA_SPAWN_JOB_TOKEN             the token itself (export it before srun or mpirun)
//   XLA_SPAWN_JOB_TOKEN_FILE        a file that holds it
//   ~/.config/xla-spawn/job-token   created with 128 random bits on first use (mode 0600),
//                                   like Erlang's ~/.erlang.cookie: hosts that share a home
//                                   directory find the same token without any set-up
//
//   const xs::cluster::JobToken token = xs::cluster::JobToken::load();
//   const xs::cluster::Mac mac = token.mac("client", server_nonce, client_nonce);

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "xla_spawn/cluster/siphash.h"

namespace xs::cluster {

inline constexpr const char* kJobTokenEnv = "XLA_SPAWN_JOB_TOKEN";
inline constexpr const char* kJobTokenFileEnv = "XLA_SPAWN_JOB_TOKEN_FILE";
// Printable ASCII, 16..1024 characters: short enough for any environment, long enough that
// a generated token (32 hex digits) or a passphrase carries real entropy.
inline constexpr size_t kMinTokenChars = 16;
inline constexpr size_t kMaxTokenChars = 1024;

using Nonce = std::array<uint8_t, 16>;
using Mac = std::array<uint8_t, 16>;

class JobToken {
 public:
  // Validates `text` (printable, 16..1024 characters); throws xs::InvalidArgument naming
  // `where` otherwise.
  JobToken(std::string_view text, std::string where);

  // From the environment or the token file (see above); creates the default file when
  // neither is set. Throws InvalidArgument for a bad token or a file that others may read,
  // IoError when the file cannot be read or created.
  static JobToken load();

  // Where the token came from ("XLA_SPAWN_JOB_TOKEN", or a file's path), for messages.
  const std::string& source() const { return source_; }
  // The token text: the launcher hands it to its replicas in XLA_SPAWN_JOB_TOKEN.
  const std::string& text() const { return text_; }

  // 128-bit MAC of (purpose, first, second) under the token's keys.
  Mac mac(std::string_view purpose, const Nonce& first, const Nonce& second) const;

 private:
  std::string text_;
  std::string source_;
  SipKey key_a_;  // two keys derived from the token: the MAC's two 64-bit halves
  SipKey key_b_;
};

// A fresh random nonce (getrandom). Throws IoError if the kernel refuses.
Nonce random_nonce();
// A new random token: 32 hex digits (128 bits).
std::string random_token_text();
// Equality in time independent of where the MACs differ.
bool mac_equal(const Mac& a, const Mac& b);

}  // namespace xs::cluster
