#include "collectives/detail/node_groups.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <numeric>
#include <system_error>

#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "base/error.h"
#include "base/splitmix64.h"
#include "collectives/reduce.h"

namespace xs::detail {
namespace {

// At most this many bytes per member in all_gather_bytes: the sizes come from peers, and a
// corrupt one must be an error rather than a huge allocation.
constexpr uint64_t kMaxGatherBytes = uint64_t{1} << 30;
// Ordinals listed in an error message before "...".
constexpr size_t kListedOrdinals = 8;

// A store whose get() waits for the key at most `timeout` (gloo's connectFullMesh calls get()
// for keys a peer has yet to set, and a store's own get() may wait longer or forever, e.g.
// FileStore's 30 s), then reads it.
class DeadlineStore final : public gloo::rendezvous::Store {
 public:
  DeadlineStore(gloo::rendezvous::Store& inner, std::chrono::milliseconds timeout)
      : inner_(inner), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    inner_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    inner_.wait({key}, timeout_);
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { inner_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_.wait(keys, timeout);
  }

 private:
  gloo::rendezvous::Store& inner_;
  std::chrono::milliseconds timeout_;
};

// A write to a socket whose peer died raises SIGPIPE, whose default action kills the process;
// ignored, the write fails with EPIPE and gloo reports the broken connection as an error (its
// own tests do the same). Only the default disposition is replaced: a handler the program
// installed stays.
void ignore_default_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

// gloo's options take a typed pointer only to learn the element size (reductions go through
// our function), so one unsigned type of each size stands in for the dtypes.
template <class Options>
void set_output(Options& options, DType dtype, std::byte* data, size_t count) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return options.template setOutput<uint64_t>(reinterpret_cast<uint64_t*>(data), count);
    case DType::kF32:
    case DType::kI32:
      return options.template setOutput<uint32_t>(reinterpret_cast<uint32_t*>(data), count);
    case DType::kBF16:
      return options.template setOutput<uint16_t>(reinterpret_cast<uint16_t*>(data), count);
    case DType::kBool:
      return options.template setOutput<uint8_t>(reinterpret_cast<uint8_t*>(data), count);
  }
}

// gloo's reduce function, with the project's arithmetic (reduce_sources) on two operands.
std::function<void(void*, const void*, const void*, size_t)> reduction(DType dtype, ReduceOp op) {
  return [dtype, op](void* out, const void* a, const void* b, size_t count) {
    const void* sources[] = {a, b};
    reduce_sources(out, nullptr, sources, 2, count, dtype, op, 1);
  };
}

bool is_timeout(const std::string& gloo_text) {
  std::string lower = gloo_text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find("timeout") != std::string::npos || lower.find("timed out") != std::string::npos;
}

}  // namespace

std::string CallInfo::describe() const {
  if (!dtype) return name;
  return fmt::format("{} ({}, {} elements)", name, dtype_name(*dtype), n_elems);
}

std::string group_key(std::span<const int> holders) {
  uint64_t hash = splitmix64_finalize(holders.size());
  for (int holder : holders) {
    hash = splitmix64_finalize(hash + kSplitMix64Increment + static_cast<uint64_t>(holder));
  }
  return fmt::format("{:016x}", hash);
}

NodeGroups::NodeGroups(NodeTopology topology, std::shared_ptr<gloo::rendezvous::Store> store,
                       const std::string& address, std::string prefix, int64_t timeout_ms)
    : topology_(std::move(topology)),
      store_(std::move(store)),
      prefix_(std::move(prefix)),
      timeout_(timeout_ms) {
  ignore_default_sigpipe();
  gloo::transport::tcp::attr attr;
  attr.hostname = address;
  try {
    device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw IoError(fmt::format("multi-host communicator: no gloo device on address '{}': {}",
                              address, e.what()));
  }
}

NodeGroups::~NodeGroups() = default;

std::string NodeGroups::where(std::span<const int> holders) const {
  std::string ordinals;
  for (size_t h = 0; h < holders.size() && h < kListedOrdinals; ++h) {
    const int ordinal = topology_.first_ordinal(static_cast<int>(h)) + holders[h];
    ordinals += fmt::format("{}{}", h == 0 ? "" : ", ", ordinal);
  }
  if (holders.size() > kListedOrdinals)
    ordinals += fmt::format(", ... ({} in all)", holders.size());
  return fmt::format("{} across nodes 0-{} (ordinals {})", call_.describe(), topology_.nnodes() - 1,
                     ordinals);
}

const std::shared_ptr<gloo::Context>& NodeGroups::context(std::span<const int> holders) {
  std::vector<int> key(holders.begin(), holders.end());
  if (auto it = contexts_.find(key); it != contexts_.end()) return it->second;
  const auto start = std::chrono::steady_clock::now();
  auto context = std::make_shared<gloo::rendezvous::Context>(topology_.node(), topology_.nnodes());
  context->setTimeout(timeout_);
  DeadlineStore bounded(*store_, timeout_);
  gloo::rendezvous::PrefixStore store(prefix_ + "/" + group_key(holders), bounded);
  context->connectFullMesh(store, device_);
  connect_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return contexts_.emplace(std::move(key), std::move(context)).first->second;
}

void NodeGroups::run(std::span<const int> holders, const Op& op) {
  const auto start = std::chrono::steady_clock::now();
  struct AddElapsed {  // on every exit path, exceptions included
    double& total;
    std::chrono::steady_clock::time_point start;
    ~AddElapsed() {
      total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  } add{network_seconds_, start};
  std::string gloo_text;
  try {
    return op(context(holders));
  } catch (const gloo::Exception& e) {
    gloo_text = e.what();
  } catch (const gloo::EnforceNotMet& e) {
    gloo_text = e.what();
  } catch (const std::system_error& e) {  // connectFullMesh's gethostname
    gloo_text = e.what();
  }
  const std::string message = fmt::format("{}: gloo: {}", where(holders), gloo_text);
  if (is_timeout(gloo_text)) throw Timeout(message);
  throw PeerFailure(message);
}

void NodeGroups::all_reduce(std::span<const int> holders, std::byte* data, size_t count,
                            DType dtype, ReduceOp op) {
  if (topology_.nnodes() == 1 || count == 0) return;
  run(holders, [&](const std::shared_ptr<gloo::Context>& context) {
    gloo::AllreduceOptions options(context);
    set_output(options, dtype, data, count);
    options.setReduceFunction(reduction(dtype, op));
    gloo::allreduce(options);
  });
}

void NodeGroups::broadcast(std::span<const int> holders, std::byte* data, size_t n_bytes,
                           int root_node) {
  if (topology_.nnodes() == 1 || n_bytes == 0) return;
  run(holders, [&](const std::shared_ptr<gloo::Context>& context) {
    gloo::BroadcastOptions options(context);
    options.setOutput(reinterpret_cast<uint8_t*>(data), n_bytes);
    options.setRoot(root_node);
    gloo::broadcast(options);
  });
}

void NodeGroups::reduce(std::span<const int> holders, std::byte* data, size_t count, DType dtype,
                        ReduceOp op, int root_node) {
  if (topology_.nnodes() == 1 || count == 0) return;
  run(holders, [&](const std::shared_ptr<gloo::Context>& context) {
    gloo::ReduceOptions options(context);
    set_output(options, dtype, data, count);
    options.setRoot(root_node);
    options.setReduceFunction(reduction(dtype, op));
    gloo::reduce(options);
  });
}

void NodeGroups::barrier(std::span<const int> holders) {
  if (topology_.nnodes() == 1) return;
  run(holders, [](const std::shared_ptr<gloo::Context>& context) {
    gloo::BarrierOptions options(context);
    gloo::barrier(options);
  });
}

std::vector<std::vector<std::byte>> NodeGroups::all_gather_bytes(std::span<const int> holders,
                                                                 std::span<const std::byte> mine) {
  const auto n = static_cast<size_t>(topology_.nnodes());
  if (n == 1) return {std::vector<std::byte>(mine.begin(), mine.end())};
  std::vector<uint64_t> sizes(n);
  std::vector<uint8_t> gathered;
  run(holders, [&](const std::shared_ptr<gloo::Context>& context) {
    uint64_t my_size = mine.size();
    gloo::AllgatherOptions announce(context);
    announce.setInput(&my_size, 1);
    announce.setOutput(sizes.data(), n);
    gloo::allgather(announce);
    for (size_t h = 0; h < n; ++h) {
      if (sizes[h] > kMaxGatherBytes) {
        throw PeerFailure(fmt::format("{}: node {} announced {} bytes, at most {} expected",
                                      where(holders), h, sizes[h], kMaxGatherBytes));
      }
    }
    gathered.resize(
        std::max<uint64_t>(1, std::accumulate(sizes.begin(), sizes.end(), uint64_t{0})));
    gloo::AllgathervOptions exchange(context);
    auto* in = reinterpret_cast<uint8_t*>(const_cast<std::byte*>(mine.data()));
    if (!mine.empty()) exchange.setInput(in, mine.size());
    exchange.setOutput(gathered.data(), std::vector<size_t>(sizes.begin(), sizes.end()));
    gloo::allgatherv(exchange);
  });
  std::vector<std::vector<std::byte>> by_node(n);
  size_t at = 0;
  for (size_t h = 0; h < n; ++h) {
    const auto* begin = reinterpret_cast<const std::byte*>(gathered.data()) + at;
    by_node[h].assign(begin, begin + sizes[h]);
    at += sizes[h];
  }
  return by_node;
}

void NodeGroups::close_all() noexcept {
  for (auto& [holders, context] : contexts_) {
    try {
      context->closeConnections();
    } catch (...) {  // a half-broken context: closing is best effort, the failure is reported
    }
  }
}

}  // namespace xs::detail
