#include "xla_spawn/cluster/store_client.h"

#include <fmt/format.h>

#include "xla_spawn/cluster/handshake.h"

namespace xs::cluster {
namespace {

// A reply may take the server's own wait plus the way back: allow this much on top.
constexpr auto kReplySlack = std::chrono::seconds(5);

uint32_t to_wire_ms(std::chrono::milliseconds ms) {
  return static_cast<uint32_t>(std::clamp<int64_t>(ms.count(), 0, UINT32_MAX));
}

Connection connect_and_authenticate(const std::string& host, uint16_t port, const JobToken& token,
                                    std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  Connection c = connect_to(host, port, deadline);
  client_handshake(c, token, Role::kStore, deadline);
  return c;
}

}  // namespace

StoreClient::StoreClient(const std::string& host, uint16_t port, const JobToken& token,
                         std::chrono::milliseconds timeout)
    : connection_(connect_and_authenticate(host, port, token, timeout)), timeout_(timeout) {}

Message StoreClient::request(const Message& m, std::chrono::milliseconds wait_ms) {
  std::lock_guard lock(mutex_);
  const auto deadline = Clock::now() + wait_ms + kReplySlack;
  connection_.send_blocking(m, deadline);
  Message reply = connection_.receive_blocking(deadline);
  if (const auto* error = std::get_if<ErrorReply>(&reply)) {
    if (error->message.find("not set within") != std::string::npos) throw Timeout(error->message);
    throw_refusal(connection_, *error);
  }
  return reply;
}

void StoreClient::set(const std::string& key, const std::vector<char>& data) {
  const Message reply = request(StoreSet{key, data}, std::chrono::milliseconds(0));
  if (!std::holds_alternative<StoreOk>(reply)) {
    throw ProtocolError(fmt::format("store set '{}': unexpected {}", key, message_name(reply)));
  }
}

std::vector<char> StoreClient::get(const std::string& key) {
  Message reply = request(StoreGet{key, to_wire_ms(timeout_)}, timeout_);
  if (auto* value = std::get_if<StoreValue>(&reply)) return std::move(value->value);
  throw ProtocolError(fmt::format("store get '{}': unexpected {}", key, message_name(reply)));
}

void StoreClient::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void StoreClient::wait(const std::vector<std::string>& keys,
                       const std::chrono::milliseconds& timeout) {
  const Message reply = request(StoreWait{keys, to_wire_ms(timeout)}, timeout);
  if (!std::holds_alternative<StoreOk>(reply)) {
    throw ProtocolError(fmt::format("store wait: unexpected {}", message_name(reply)));
  }
}

}  // namespace xs::cluster
