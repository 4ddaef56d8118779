#pragma once
// The rendezvous protocol's messages and their wire format. Every message is one frame: a
// little-endian u32 body length, then the body: a u8 message type and the type's fields in
// order (integers little-endian; strings and byte arrays as a u32 length and the bytes; lists
// as a u32 count and the items). decode() checks every length against what the frame holds
// and against the field's limit, and rejects unknown types and trailing bytes, so a
// malformed, truncated or oversized frame is a ProtocolError naming the field, never a
// crash or a large allocation.
//
//   std::string frame = xs::cluster::encode_frame(xs::cluster::Heartbeat{});
//   xs::cluster::Message m = xs::cluster::decode(body);            // throws ProtocolError
//   if (const auto* w = std::get_if<xs::cluster::World>(&m)) ...
//
// A conversation: the client sends Hello; the server answers Challenge (or ErrorReply and
// closes); the client proves the job token with Auth; the server proves it back with
// Welcome. A node's launcher then sends Register and receives World once every node has;
// both sides send Heartbeat every second; Failed, Stop, AttemptDone, Next and End carry the
// job's failures and restarts (cluster/coordinator.h). A replica's store client sends
// StoreSet, StoreGet and StoreWait, answered by StoreValue, StoreOk or ErrorReply. A node
// whose connection has fallen silent proves it is alive on a new one: after the handshake it
// sends Alive instead of Register, answered by Heartbeat or ErrorReply
// (cluster/liveness_probe.h).

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "xla_spawn/base/error.h"
#include "xla_spawn/cluster/job_token.h"

namespace xs::cluster {

// "XSRZ" (xla-spawn rendezvous), first word of every Hello.
inline constexpr uint32_t kProtocolMagic = 0x5a525358;
// Bumped on any change of the messages; a mismatch is refused at Hello with both numbers.
inline constexpr uint32_t kProtocolVersion = 3;
// A store value up to 1 MiB (gloo's per-rank address list for thousands of peers) plus its
// key; every other message is far smaller.
inline constexpr size_t kMaxValueBytes = size_t{1} << 20;
inline constexpr size_t kMaxFrameBytes = kMaxValueBytes + 8192;
// Before authentication a peer may only send Hello and Auth: a stranger cannot make the
// server buffer more than this.
inline constexpr size_t kMaxUnauthenticatedFrameBytes = 256;
inline constexpr size_t kMaxKeyBytes = 1024;
inline constexpr size_t kMaxTextBytes = 16384;  // messages, summaries, output lines
inline constexpr size_t kMaxCommandBytes = 1024;  // a node's command line, as it shows it
inline constexpr uint32_t kMaxNodes = 4096;
inline constexpr uint32_t kMaxNodeProcs = 1024;

// A frame that does not follow the protocol (the peer is broken, foreign or hostile).
class ProtocolError : public PeerFailure {
 public:
  using PeerFailure::PeerFailure;
};

enum class Role : uint8_t { kNode = 1, kStore = 2 };

struct Hello {
  uint32_t magic = kProtocolMagic;
  uint32_t version = kProtocolVersion;
  Role role = Role::kNode;
  Nonce nonce{};
};
struct Challenge {
  uint32_t version = kProtocolVersion;
  Nonce nonce{};
};
struct Auth {
  Mac mac{};
};
struct Welcome {
  Mac mac{};
};
struct ErrorReply {
  std::string message;
};

struct Register {
  uint32_t node = 0;
  uint32_t nnodes = 0;
  uint32_t nprocs = 0;
  int32_t pid = 0;
  std::string hostname;
  std::string host_addr;  // where this node's replicas accept gloo connections
  // The node's XLA_SPAWN_HEARTBEAT_TIMEOUT_MS: each side beats at a quarter of its own, so
  // they must agree.
  uint32_t heartbeat_timeout_ms = 0;
  std::string command;  // what its replicas run (shell-quoted, cut at kMaxCommandBytes)
};
struct NodeInfo {
  uint32_t nprocs = 0;
  std::string hostname;
  std::string host_addr;
};
struct World {
  std::string job_id;
  uint32_t torch_port = 0;    // MASTER_PORT for torch.distributed-style programs
  uint32_t max_restarts = 0;  // the master's --max-restarts: it decides every restart
  std::vector<NodeInfo> nodes;
  std::string notice;  // what every node prints as the job forms (nodes running other commands)
};
struct Heartbeat {};

// How a node's attempt failed. kLost is the server's own finding (no message carries it).
enum class FailureKind : uint8_t {
  kExited = 1,         // a replica exited non-zero
  kSignalled = 2,      // a replica was killed by a signal it was not sent by xla-spawn
  kTimedOut = 3,       // --timeout expired on that node
  kInterrupted = 4,    // that node's xla-spawn received SIGINT/SIGTERM/SIGHUP
  kLauncherError = 5,  // that node's xla-spawn found its segment corrupted
  kLost = 6,
};
struct Failed {
  uint32_t attempt = 0;
  int32_t local_ordinal = -1;  // -1 when no replica is to blame (timeout, signal)
  FailureKind kind = FailureKind::kExited;
  int32_t exit_code = 1;  // what xla-spawn exits with for this cause
  int64_t wall_ns = 0;    // CLOCK_REALTIME when it happened
  std::string description;        // "exited with code 3", "killed by signal 9 (SIGKILL: ...)"
  std::vector<std::string> tail;  // the replica's last output lines
};
struct Stop {
  uint32_t attempt = 0;
  std::string reason;
};
struct AttemptDone {
  uint32_t attempt = 0;
  int32_t exit_code = 0;  // 0: every replica of the node exited 0
};
struct Next {
  uint32_t attempt = 0;
  std::string cause;  // the failed attempt's root cause, as End's summary words it
};
struct End {
  int32_t exit_code = 0;
  std::string summary;  // empty on success
};

struct StoreSet {
  std::string key;
  std::vector<char> value;
};
struct StoreGet {
  std::string key;
  uint32_t timeout_ms = 0;
};
struct StoreWait {
  std::vector<std::string> keys;
  uint32_t timeout_ms = 0;
};
struct StoreValue {
  std::vector<char> value;
};
struct StoreOk {};

// On a new connection, from node `node`'s launcher (process `pid`, as registered). With
// `leaving` set, the node's last word instead: it leaves the job for that reason (its own
// connection carries nothing any more, so it cannot say so there).
struct Alive {
  uint32_t node = 0;
  int32_t pid = 0;
  std::string leaving;
};

using Message = std::variant<Hello, Challenge, Auth, Welcome, ErrorReply, Register, World,
                             Heartbeat, Failed, Stop, AttemptDone, Next, End, StoreSet, StoreGet,
                             StoreWait, StoreValue, StoreOk, Alive>;

// The message's name, for errors ("Register").
std::string_view message_name(const Message& message);

// The frame: length prefix and body.
std::string encode_frame(const Message& message);
// Parses one frame body (without its length prefix).
Message decode(std::string_view body);

}  // namespace xs::cluster
