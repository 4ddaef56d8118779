#pragma once
// The fuzz target for the rendezvous protocol (cluster/wire.h) and the job coordinator that
// the master runs on what it receives (cluster/coordinator.h), shared by the libFuzzer entry
// point (fuzz/rendezvous_fuzz.cpp, built by fuzz/run) and the CTest corpus replay
// (tests/fuzz/rendezvous_corpus_test.cpp). The input is a stream of frames as a connection
// would carry them (u32 length, body). Every frame must either decode, re-encode to the same
// bytes and be handled by a coordinator of a 3-node job as the server would hand it on, or
// be refused with a ProtocolError; anything else escaping, a broken invariant, or a crash is
// a bug. The input is accepted when every frame decoded.
//
//   bool accepted = xs::fuzz::rendezvous_one_input(data, size);  // throws only on a bug

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>

#include "xla_spawn/cluster/coordinator.h"
#include "xla_spawn/cluster/wire.h"

namespace xs::fuzz {

inline void require_rdzv(bool ok, const char* what) {
  if (!ok) throw std::logic_error(what);
}

// Hands one decoded message to the coordinator as the server would: Register from a new
// connection, the rest from node `sender` once it has registered (the server drops others).
inline void apply(cluster::JobCoordinator& job, const cluster::Message& m, int sender,
                  cluster::Clock::time_point now) {
  using namespace cluster;
  const bool registered = job.registered(sender);
  std::vector<Outgoing> out;
  if (const auto* reg = std::get_if<Register>(&m)) {
    const auto result = job.on_register(*reg);
    if (const auto* refusal = std::get_if<std::string>(&result)) {
      require_rdzv(!refusal->empty(), "coordinator: a refusal without a reason");
    }
    return;
  }
  if (!registered) return;
  if (const auto* failed = std::get_if<Failed>(&m)) out = job.on_failed(sender, *failed, now);
  if (const auto* done = std::get_if<AttemptDone>(&m)) out = job.on_attempt_done(sender, *done, now);
  if (std::holds_alternative<Heartbeat>(m)) out = job.on_tick(now);
  if (std::holds_alternative<StoreOk>(m)) out = job.on_lost(sender, "fuzzed loss", 0, now);
  for (const Outgoing& o : out) {
    require_rdzv(o.node == Outgoing::kEveryNode || (o.node >= 0 && o.node < 3),
                 "coordinator: a message for a node outside the job");
    if (const auto* end = std::get_if<End>(&o.message)) {
      require_rdzv(job.phase() == JobCoordinator::Phase::kEnded, "coordinator: End while running");
      require_rdzv((end->exit_code == 0) == end->summary.empty(),
                   "coordinator: a failed End without a summary, or a summary on success");
    }
  }
}

inline bool rendezvous_one_input(const uint8_t* data, size_t size) {
  using namespace cluster;
  const auto start = Clock::time_point() + std::chrono::hours(1);
  JobCoordinator job({3, 1, std::chrono::milliseconds(500), 0, "xs-fuzz-1"}, start);
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  int frames = 0;
  while (!rest.empty() && frames < 256) {
    if (rest.size() < 4) return false;
    uint32_t length = 0;
    for (int i = 3; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(rest[static_cast<size_t>(i)]);
    if (length > kMaxFrameBytes || length > rest.size() - 4) return false;
    const std::string_view body = rest.substr(4, length);
    Message m;
    try {
      m = decode(body);
    } catch (const ProtocolError& e) {
      require_rdzv(std::string_view(e.what()).size() > 0, "decode: a refusal without a reason");
      return false;
    }
    require_rdzv(encode_frame(m) == rest.substr(0, 4 + length), "encode(decode(frame)) != frame");
    // Time advances 100 ms a frame, so the rendezvous deadline (500 ms) can pass mid-input.
    apply(job, m, frames % 3, start + std::chrono::milliseconds(100) * frames);
    rest.remove_prefix(4 + length);
    ++frames;
  }
  return true;
}

}  // namespace xs::fuzz
