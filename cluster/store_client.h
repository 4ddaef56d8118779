#pragma once
// A replica's client of the rendezvous server's key-value store, as the
// gloo::rendezvous::Store through which gloo's contexts exchange their addresses (the part
// torch's TCPStore plays for ProcessGroupGloo). One authenticated connection, one request at
// a time; every call has a deadline. get() and wait() wait on the server for keys another
// replica has not set yet.
//
//   auto store = std::make_shared<xs::cluster::StoreClient>(addr, port, token, timeout);
//   gloo::rendezvous::PrefixStore prefixed("job/attempt-0/g0", *store);
//   context->connectFullMesh(prefixed, device);

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "xla_spawn/cluster/connection.h"
#include "xla_spawn/cluster/job_token.h"

namespace xs::cluster {

class StoreClient final : public gloo::rendezvous::Store {
 public:
  // Connects (retrying until `timeout`: the server may still be starting) and authenticates.
  // Throws Timeout, PeerFailure (refused) or IoError.
  StoreClient(const std::string& host, uint16_t port, const JobToken& token,
              std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to the client's timeout for the key to be set.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  Message request(const Message& m, std::chrono::milliseconds wait_ms);

  std::mutex mutex_;  // one request at a time on the connection
  Connection connection_;
  std::chrono::milliseconds timeout_;
};

}  // namespace xs::cluster
