#include "xla_spawn/cluster/wire.h"

#include <cstring>
#include <type_traits>

#include <fmt/format.h>

namespace xs::cluster {
namespace {

// Appends fields to a frame body.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  template <typename T>
  void integer(T value, std::string_view) {
    using U = std::make_unsigned_t<T>;
    for (size_t i = 0; i < sizeof(T); ++i) {
      out_->push_back(static_cast<char>(static_cast<U>(value) >> (8 * i)));
    }
  }
  template <typename E>
  void enumeration(E value, std::string_view what, uint8_t, uint8_t) {
    integer(static_cast<uint8_t>(value), what);
  }
  template <size_t N>
  void array(const std::array<uint8_t, N>& value, std::string_view) {
    out_->append(reinterpret_cast<const char*>(value.data()), N);
  }
  template <typename Bytes>
  void bytes(const Bytes& value, size_t, std::string_view what) {
    integer(static_cast<uint32_t>(value.size()), what);
    out_->append(value.data(), value.size());
  }
  template <typename T, typename Each>
  void list(const std::vector<T>& items, size_t, std::string_view what, Each&& each,
            size_t = 0) {
    integer(static_cast<uint32_t>(items.size()), what);
    for (const T& item : items) each(*this, const_cast<T&>(item));
  }

 private:
  std::string* out_;
};

// Reads fields from a frame body, checking every length.
class Reader {
 public:
  explicit Reader(std::string_view body) : body_(body) {}
  template <typename T>
  void integer(T& value, std::string_view what) {
    using U = std::make_unsigned_t<T>;
    const std::string_view raw = take(sizeof(T), what);
    U u = 0;
    for (size_t i = 0; i < sizeof(T); ++i) u |= static_cast<U>(static_cast<uint8_t>(raw[i])) << (8 * i);
    value = static_cast<T>(u);
  }
  template <typename E>
  void enumeration(E& value, std::string_view what, uint8_t first, uint8_t last) {
    uint8_t raw = 0;
    integer(raw, what);
    if (raw < first || raw > last) {
      throw ProtocolError(fmt::format("{}: value {} outside {}..{}", what, raw, first, last));
    }
    value = static_cast<E>(raw);
  }
  template <size_t N>
  void array(std::array<uint8_t, N>& value, std::string_view what) {
    std::memcpy(value.data(), take(N, what).data(), N);
  }
  template <typename Bytes>
  void bytes(Bytes& value, size_t max, std::string_view what) {
    const uint32_t n = length(max, 1, what);
    const std::string_view raw = take(n, what);
    value.assign(raw.begin(), raw.end());
  }
  // `min_item_bytes`: the smallest encoding of one item, so a count cannot promise more
  // items than the frame can hold (which would reserve memory for nothing).
  template <typename T, typename Each>
  void list(std::vector<T>& items, size_t max, std::string_view what, Each&& each,
            size_t min_item_bytes = 4) {
    const uint32_t n = length(max, min_item_bytes, what);
    items.resize(n);
    for (T& item : items) each(*this, item);
  }
  void finish(std::string_view message) const {
    if (at_ != body_.size()) {
      throw ProtocolError(fmt::format("{}: {} trailing byte(s) after the last field", message,
                                      body_.size() - at_));
    }
  }

 private:
  uint32_t length(size_t max, size_t unit_bytes, std::string_view what) {
    uint32_t n = 0;
    integer(n, what);
    if (n > max) throw ProtocolError(fmt::format("{}: length {} above the limit {}", what, n, max));
    if (static_cast<uint64_t>(n) * unit_bytes > body_.size() - at_) {
      throw ProtocolError(fmt::format("{}: length {} but only {} byte(s) left in the frame", what,
                                      n, body_.size() - at_));
    }
    return n;
  }
  std::string_view take(size_t n, std::string_view what) {
    if (n > body_.size() - at_) {
      throw ProtocolError(fmt::format("{}: frame ends {} byte(s) early", what, n - (body_.size() - at_)));
    }
    const std::string_view raw = body_.substr(at_, n);
    at_ += n;
    return raw;
  }

  std::string_view body_;
  size_t at_ = 0;
};

// Each message's fields, in wire order, for both directions. `A` is Writer or Reader.
template <typename A>
void text(A& a, std::string& s, size_t max, std::string_view what) {
  a.bytes(s, max, what);
}

template <typename A>
void fields(A& a, Hello& m) {
  a.integer(m.magic, "Hello.magic");
  a.integer(m.version, "Hello.version");
  a.enumeration(m.role, "Hello.role", 1, 2);
  a.array(m.nonce, "Hello.nonce");
}
template <typename A>
void fields(A& a, Challenge& m) {
  a.integer(m.version, "Challenge.version");
  a.array(m.nonce, "Challenge.nonce");
}
template <typename A>
void fields(A& a, Auth& m) {
  a.array(m.mac, "Auth.mac");
}
template <typename A>
void fields(A& a, Welcome& m) {
  a.array(m.mac, "Welcome.mac");
}
template <typename A>
void fields(A& a, ErrorReply& m) {
  text(a, m.message, kMaxTextBytes, "ErrorReply.message");
}
template <typename A>
void fields(A& a, Register& m) {
  a.integer(m.node, "Register.node");
  a.integer(m.nnodes, "Register.nnodes");
  a.integer(m.nprocs, "Register.nprocs");
  a.integer(m.pid, "Register.pid");
  text(a, m.hostname, 255, "Register.hostname");
  text(a, m.host_addr, 255, "Register.host_addr");
  a.integer(m.heartbeat_timeout_ms, "Register.heartbeat_timeout_ms");
  text(a, m.command, kMaxCommandBytes, "Register.command");
}
template <typename A>
void node_info(A& a, NodeInfo& m) {
  a.integer(m.nprocs, "World.nodes.nprocs");
  text(a, m.hostname, 255, "World.nodes.hostname");
  text(a, m.host_addr, 255, "World.nodes.host_addr");
}
template <typename A>
void fields(A& a, World& m) {
  text(a, m.job_id, 255, "World.job_id");
  a.integer(m.torch_port, "World.torch_port");
  a.integer(m.max_restarts, "World.max_restarts");
  a.list(m.nodes, kMaxNodes, "World.nodes", [](A& a2, NodeInfo& n) { node_info(a2, n); });
  text(a, m.notice, kMaxTextBytes, "World.notice");
}
template <typename A>
void fields(A&, Heartbeat&) {}
template <typename A>
void fields(A& a, Failed& m) {
  a.integer(m.attempt, "Failed.attempt");
  a.integer(m.local_ordinal, "Failed.local_ordinal");
  a.enumeration(m.kind, "Failed.kind", 1, 5);  // kLost is never sent
  a.integer(m.exit_code, "Failed.exit_code");
  a.integer(m.wall_ns, "Failed.wall_ns");
  text(a, m.description, kMaxTextBytes, "Failed.description");
  a.list(m.tail, 64, "Failed.tail",
         [](A& a2, std::string& line) { text(a2, line, kMaxTextBytes, "Failed.tail line"); });
}
template <typename A>
void fields(A& a, Stop& m) {
  a.integer(m.attempt, "Stop.attempt");
  text(a, m.reason, kMaxTextBytes, "Stop.reason");
}
template <typename A>
void fields(A& a, AttemptDone& m) {
  a.integer(m.attempt, "AttemptDone.attempt");
  a.integer(m.exit_code, "AttemptDone.exit_code");
}
template <typename A>
void fields(A& a, Next& m) {
  a.integer(m.attempt, "Next.attempt");
  text(a, m.cause, 4 * kMaxTextBytes, "Next.cause");
}
template <typename A>
void fields(A& a, End& m) {
  a.integer(m.exit_code, "End.exit_code");
  text(a, m.summary, 4 * kMaxTextBytes, "End.summary");
}
template <typename A>
void fields(A& a, StoreSet& m) {
  text(a, m.key, kMaxKeyBytes, "StoreSet.key");
  a.bytes(m.value, kMaxValueBytes, "StoreSet.value");
}
template <typename A>
void fields(A& a, StoreGet& m) {
  text(a, m.key, kMaxKeyBytes, "StoreGet.key");
  a.integer(m.timeout_ms, "StoreGet.timeout_ms");
}
template <typename A>
void fields(A& a, StoreWait& m) {
  a.list(m.keys, 65536, "StoreWait.keys",
         [](A& a2, std::string& key) { text(a2, key, kMaxKeyBytes, "StoreWait.key"); });
  a.integer(m.timeout_ms, "StoreWait.timeout_ms");
}
template <typename A>
void fields(A& a, StoreValue& m) {
  a.bytes(m.value, kMaxValueBytes, "StoreValue.value");
}
template <typename A>
void fields(A&, StoreOk&) {}
template <typename A>
void fields(A& a, Alive& m) {
  a.integer(m.node, "Alive.node");
  a.integer(m.pid, "Alive.pid");
  text(a, m.leaving, kMaxTextBytes, "Alive.leaving");
}

constexpr std::string_view kNames[] = {
    "Hello",     "Challenge", "Auth", "Welcome",     "ErrorReply", "Register",
    "World",     "Heartbeat", "Failed", "Stop",      "AttemptDone", "Next",
    "End",       "StoreSet",  "StoreGet", "StoreWait", "StoreValue", "StoreOk",
    "Alive"};
static_assert(std::size(kNames) == std::variant_size_v<Message>);

// Builds the alternative with index I when I == index, else tries I + 1.
template <size_t I = 0>
Message decode_alternative(size_t index, Reader& reader) {
  if constexpr (I == std::variant_size_v<Message>) {
    throw ProtocolError(fmt::format("unknown message type {}", index + 1));
  } else {
    if (index != I) return decode_alternative<I + 1>(index, reader);
    std::variant_alternative_t<I, Message> m;
    fields(reader, m);
    reader.finish(kNames[I]);
    return m;
  }
}

}  // namespace

std::string_view message_name(const Message& message) {
  return kNames[message.index()];
}

// The type byte is the alternative's position in Message plus one (0 is never valid), so
// reordering Message changes the protocol and must bump kProtocolVersion.
std::string encode_frame(const Message& message) {
  std::string frame(4, '\0');
  frame.push_back(static_cast<char>(message.index() + 1));
  Writer writer(&frame);
  std::visit([&writer](const auto& m) { fields(writer, const_cast<std::decay_t<decltype(m)>&>(m)); },
             message);
  const uint32_t body = static_cast<uint32_t>(frame.size() - 4);
  for (int i = 0; i < 4; ++i) frame[static_cast<size_t>(i)] = static_cast<char>(body >> (8 * i));
  return frame;
}

Message decode(std::string_view body) {
  if (body.empty()) throw ProtocolError("empty frame: no message type");
  const uint8_t type = static_cast<uint8_t>(body[0]);
  if (type == 0 || type > std::variant_size_v<Message>) {
    throw ProtocolError(fmt::format("unknown message type {}", type));
  }
  Reader reader(body.substr(1));
  return decode_alternative(type - 1u, reader);
}

}  // namespace xs::cluster
