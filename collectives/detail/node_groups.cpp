#include "xla_spawn/collectives/detail/node_groups.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <deque>
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
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/base/trace.h"
#include "xla_spawn/base/splitmix64.h"
#include "xla_spawn/collectives/reduce.h"

namespace xs::detail {
namespace {

// At most this many bytes per member in all_gather_bytes: the sizes come from peers, and a
// corrupt one must be an error rather than a huge allocation.
constexpr uint64_t kMaxGatherBytes = uint64_t{1} << 30;
// Ordinals listed in an error message before "...".
constexpr size_t kListedOrdinals = 8;
// Two-node all-reduces go through gloo's bcube in slices of at most this many bytes: bcube
// allocates a scratch buffer as large as its input on every call, and from 32 MiB (glibc's
// largest mmap threshold) that is a fresh mapping whose page faults made a 64 MiB all-reduce
// 3x slower than in 16 MiB slices.
constexpr size_t kExchangeSliceBytes = size_t{16} << 20;
// Slots of the point-to-point transfers: this prefix in the top byte (gloo's collectives use
// 0x01..0x08 there), the group's batch number (mod 2^24) and the piece's index in the batch.
constexpr uint64_t kPieceSlotPrefix = uint64_t{0x58} << 56;

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
  TraceScope span("network (gloo)", "network");
  span.arg("elements", static_cast<int64_t>(call_.n_elems));
  std::string gloo_text;
  try {
    if (phase_hook_) phase_hook_(&call_);
    op(context(holders));
    if (phase_hook_) phase_hook_(nullptr);
    return;
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
  const size_t elem_bytes = dtype_size(dtype);
  if (holders.size() == 2 && count * elem_bytes > kExchangeSliceBytes) {
    const size_t slice = kExchangeSliceBytes / elem_bytes;
    for (size_t at = 0; at < count; at += slice) {
      all_reduce(holders, data + at * elem_bytes, std::min(slice, count - at), dtype, op);
    }
    return;
  }
  run(holders, [&](const std::shared_ptr<gloo::Context>& context) {
    gloo::AllreduceOptions options(context);
    set_output(options, dtype, data, count);
    options.setReduceFunction(reduction(dtype, op));
    // Between two nodes, gloo's bcube is one exchange of halves, each reduced by one side and
    // sent back: the ring's bytes without its 1 MiB segments' hand-offs (docs/perf/
    // multi-node.md). Larger groups keep the ring; their bcube (all peers at once) was not
    // measured.
    if (holders.size() == 2) options.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
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

void NodeGroups::barrier(std::span<const int> holders) {
  if (topology_.nnodes() == 1) return;
  run(holders, [](const std::shared_ptr<gloo::Context>& context) {
    gloo::BarrierOptions options(context);
    gloo::barrier(options);
  });
}

uint64_t NodeGroups::next_slot(std::span<const int> holders, size_t n_pieces) {
  if (n_pieces >= (uint64_t{1} << 32)) {
    throw InvalidArgument(fmt::format("{}: {} pieces in one batch", where(holders), n_pieces));
  }
  uint64_t& batches = batches_[std::vector<int>(holders.begin(), holders.end())];
  return kPieceSlotPrefix | ((batches++ & 0xffffff) << 32);
}

namespace {

// One point-to-point transfer of a batch: n_bytes at byte `offset` of its unbound buffer, to or
// from group rank (node) `peer`, on `slot`.
struct Transfer {
  int peer = 0;
  uint64_t slot = 0;
  size_t offset = 0;
  size_t n_bytes = 0;
};

// Transfers go in chunks of at most this many bytes, and each node keeps at most kRecvWindow
// chunks per peer posted for receiving. gloo sends a chunk only once the peer has posted its
// receive, so that is all that is ever in flight towards a node, much as gloo's ring keeps it
// (1 MiB segments): whole pieces at once put megabytes in flight per link and were slower.
constexpr size_t kChunkBytes = size_t{1} << 20;
constexpr size_t kRecvWindow = 2;
// reduce_to_owners keeps its receive buffer between calls up to this size.
constexpr size_t kKeptPartialsBytes = size_t{64} << 20;

// Runs a batch: every send from `out`, every receive into `in`, each cut into chunks posted in
// order on the transfer's slot (gloo matches a pair's sends and receives of one slot in
// order). Receives start kRecvWindow chunks per peer ahead, kRecvWindow x peers in all, and
// each arrival posts the next chunk of the next peer round-robin (gloo does not say reliably
// which peer a completion came from), so the total in flight towards this node stays bounded
// though one peer may hold more than its share while another is late. Each wait may take the
// whole `timeout`, as each of gloo's ring steps may: a batch whose every 1 MiB chunk arrives
// within `timeout` never times out, a stalled one does after `timeout` (gloo throws); so does
// one over a link too slow for a chunk in that time (under about 140 kbit/s at the default
// 60 s). False if a wait ended without its transfer (aborted: nothing here aborts).
bool run_batch(gloo::transport::UnboundBuffer& out, std::span<const Transfer> sends,
               gloo::transport::UnboundBuffer& in, std::span<const Transfer> receives, int nodes,
               std::chrono::milliseconds timeout) {
  auto for_each_chunk = [](const Transfer& t, const auto& f) {
    for (size_t at = 0; at < t.n_bytes; at += kChunkBytes) {
      f(Transfer{t.peer, t.slot, t.offset + at, std::min(kChunkBytes, t.n_bytes - at)});
    }
  };
  size_t send_chunks = 0;
  for (const Transfer& t : sends) {
    for_each_chunk(t, [&](const Transfer& c) {
      out.send(c.peer, c.slot, c.offset, c.n_bytes);
      ++send_chunks;
    });
  }
  std::vector<std::deque<Transfer>> queued(static_cast<size_t>(nodes));
  for (const Transfer& t : receives) {
    for_each_chunk(t, [&](const Transfer& c) { queued[static_cast<size_t>(c.peer)].push_back(c); });
  }
  size_t outstanding = 0;  // receives posted, not yet waited for
  auto post = [&](std::deque<Transfer>& q) {  // q's next chunk, if any; true if posted
    if (q.empty()) return false;
    in.recv(q.front().peer, q.front().slot, q.front().offset, q.front().n_bytes);
    q.pop_front();
    ++outstanding;
    return true;
  };
  size_t next_peer = 0;
  auto post_next = [&] {  // from the next peer round-robin that has a chunk queued
    for (size_t k = 0; k < queued.size(); ++k) {
      std::deque<Transfer>& q = queued[next_peer];
      next_peer = (next_peer + 1) % queued.size();
      if (post(q)) return;
    }
  };
  for (std::deque<Transfer>& q : queued) {
    for (size_t k = 0; k < kRecvWindow && post(q); ++k) {
    }
  }
  bool all = true;
  for (; outstanding > 0; --outstanding) {
    all = in.waitRecv(nullptr, timeout) && all;
    post_next();
  }
  for (size_t i = 0; i < send_chunks; ++i) all = out.waitSend(nullptr, timeout) && all;
  return all;
}

// Bytes from `data` to the end of the batch's last piece.
size_t span_bytes(std::span<const NodeGroups::OwnedPiece> pieces, size_t elem_bytes) {
  size_t end = 0;
  for (const auto& p : pieces) end = std::max(end, p.offset + p.count);
  return end * elem_bytes;
}

}  // namespace

void NodeGroups::reduce_to_owners(std::span<const int> holders, std::byte* data,
                                  std::span<const OwnedPiece> pieces, DType dtype, ReduceOp op) {
  const int nodes = topology_.nnodes();
  if (nodes == 1 || pieces.empty()) return;
  const int me = topology_.node();
  const size_t elem_bytes = dtype_size(dtype);
  // Sends of this node's elements of others' pieces; receives of the other members' elements
  // of the pieces this node owns: per piece, nodes - 1 runs of `count` elements in node order
  // (this node skipped) in partials_.
  const uint64_t slot = next_slot(holders, pieces.size());
  std::vector<Transfer> sends, receives;
  size_t at = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const OwnedPiece& p = pieces[i];
    if (p.owner != me) {
      sends.push_back({p.owner, slot + i, p.offset * elem_bytes, p.count * elem_bytes});
      continue;
    }
    for (int node = 0; node < nodes; ++node) {
      if (node == me) continue;
      receives.push_back({node, slot + i, at * elem_bytes, p.count * elem_bytes});
      at += p.count;
    }
  }
  partials_.resize(std::max<size_t>(at * elem_bytes, 1));
  run(holders, [&](const std::shared_ptr<gloo::Context>& context) {
    auto mine = context->createUnboundBuffer(data, span_bytes(pieces, elem_bytes));
    auto theirs = context->createUnboundBuffer(partials_.data(), partials_.size());
    bool done = false;
    try {
      done = run_batch(*mine, sends, *theirs, receives, nodes, timeout_);
    } catch (...) {
      failed_buffers_.push_back(std::move(mine));
      failed_buffers_.push_back(std::move(theirs));
      throw;
    }
    if (!done) {
      failed_buffers_.push_back(std::move(mine));
      failed_buffers_.push_back(std::move(theirs));
      throw PeerFailure(fmt::format("{}: a transfer was aborted", where(holders)));
    }
  });
  std::vector<const void*> sources(static_cast<size_t>(nodes));
  at = 0;
  for (const auto& p : pieces) {
    if (p.owner != me) continue;
    std::byte* own = data + p.offset * elem_bytes;
    for (int node = 0, other = 0; node < nodes; ++node) {
      sources[static_cast<size_t>(node)] =
          node == me ? own
                     : partials_.data() + (at + p.count * static_cast<size_t>(other++)) * elem_bytes;
    }
    reduce_sources(own, nullptr, sources.data(), nodes, p.count, dtype, op, 1);
    at += p.count * static_cast<size_t>(nodes - 1);
  }
  // Kept for the next step's call (a training step's size repeats), unless it is large: one
  // big reduce-scatter must not pin (nodes - 1) x its block for the rest of the job.
  if (partials_.size() > kKeptPartialsBytes) std::vector<std::byte>().swap(partials_);
}

void NodeGroups::send_from_owners(std::span<const int> holders, std::byte* data,
                                  std::span<const OwnedPiece> pieces, size_t elem_bytes) {
  const int nodes = topology_.nnodes();
  if (nodes == 1 || pieces.empty()) return;
  const int me = topology_.node();
  const uint64_t slot = next_slot(holders, pieces.size());
  std::vector<Transfer> sends, receives;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const OwnedPiece& p = pieces[i];
    const Transfer bytes{p.owner, slot + i, p.offset * elem_bytes, p.count * elem_bytes};
    if (p.owner != me) {
      receives.push_back(bytes);
      continue;
    }
    for (int node = 0; node < nodes; ++node) {
      if (node != me) sends.push_back({node, bytes.slot, bytes.offset, bytes.n_bytes});
    }
  }
  run(holders, [&](const std::shared_ptr<gloo::Context>& context) {
    auto buffer = context->createUnboundBuffer(data, span_bytes(pieces, elem_bytes));
    bool done = false;
    try {
      done = run_batch(*buffer, sends, *buffer, receives, nodes, timeout_);
    } catch (...) {
      failed_buffers_.push_back(std::move(buffer));  // see failed_buffers_
      throw;
    }
    if (!done) {
      failed_buffers_.push_back(std::move(buffer));
      throw PeerFailure(fmt::format("{}: a transfer was aborted", where(holders)));
    }
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
