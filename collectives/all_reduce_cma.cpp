// Cross-memory-attach all-reduce: a two-shot that reads and writes peers' buffers directly.
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/detail/schedules.h"
#include "xla_spawn/collectives/reduce.h"

namespace xs::detail {
namespace {

// Bytes per peer per block: the N - 1 blocks stay in L2 while they are reduced, and big
// blocks amortise the page pinning of each system call. Measured at N = 2 (busbw, 2 MiB):
// 32 KiB 9.0-9.2 GB/s, 256 KiB 8.2-9.6; at N = 8, 128 KiB blocks cost 60% more CPU than 32.
// Rechecked at N = 2, heap operands, three runs each (2 MiB / 8 MiB busbw, GB/s): 64 KiB
// 9.4-10.4 / 7.8-9.9, 256 KiB 11.0-13.4 / 7.6-11.3, 1 MiB 7.3-7.9 / 4.7-7.9, 4 MiB
// 6.5-8.3 / 5.3-7.0.
size_t cma_block_bytes(int world_size) {
  return world_size <= 2 ? size_t{256} << 10 : 32 << 10;
}

[[noreturn]] void peer_copy_failed(Rounds& rounds, const char* what, int ordinal, int error) {
  const std::string message =
      fmt::format("{} on ordinal {}: {} of ordinal {} (pid {}) failed: {}", rounds.operation(),
                  rounds.ordinal(), what, ordinal, rounds.segment().slot(ordinal).pid.load(),
                  std::strerror(error));
  rounds.segment().poison(message);
  throw PeerFailure(message);
}

// Copies `bytes` between this process and ordinal's memory (read: theirs -> ours).
void peer_copy(Rounds& rounds, bool read, int ordinal, void* local, void* remote, size_t bytes) {
  const pid_t pid = rounds.segment().slot(ordinal).pid.load(std::memory_order_acquire);
  iovec mine{local, bytes};
  iovec theirs{remote, bytes};
  const ssize_t n = read ? ::process_vm_readv(pid, &mine, 1, &theirs, 1, 0)
                         : ::process_vm_writev(pid, &mine, 1, &theirs, 1, 0);
  if (n != static_cast<ssize_t>(bytes)) {
    peer_copy_failed(rounds, read ? "process_vm_readv" : "process_vm_writev", ordinal,
                     n < 0 ? errno : EIO);
  }
}

}  // namespace

bool negotiate_cma(Rounds& rounds) {
  // Round 1: publish the address of a word every peer tries to read. Round 2: publish
  // whether all reads worked. Every ordinal reaches the same verdict from round 2.
  static const uint64_t probe = 0x786c612d73706177;  // lives as long as the process
  const void* address = &probe;
  int parity = rounds.next_parity();
  std::memcpy(rounds.inline_data(rounds.ordinal(), parity), &address, sizeof address);
  rounds.sync();
  bool ok = true;
  for (int j = 0; j < rounds.world_size() && ok; ++j) {
    if (j == rounds.ordinal()) continue;
    uint64_t seen = 0;
    const pid_t pid = rounds.segment().slot(j).pid.load(std::memory_order_acquire);
    iovec mine{&seen, sizeof seen};
    iovec theirs{published_address(rounds, j, parity), sizeof seen};
    ok = ::process_vm_readv(pid, &mine, 1, &theirs, 1, 0) == sizeof seen && seen == probe;
  }
  parity = rounds.next_parity();
  *rounds.inline_data(rounds.ordinal(), parity) = std::byte{ok};
  rounds.sync();
  for (int j = 0; j < rounds.world_size(); ++j) {
    ok = ok && *rounds.inline_data(j, parity) == std::byte{1};
  }
  return ok;
}

// CMA two-shot schedule. publish_operand() published every ordinal's buffer address; ordinal j then
// owns chunk j of the buffer: block by block it reads chunk j of every peer's buffer
// straight out of that process (process_vm_readv, no staging), reduces the N blocks in
// ordinal order 0..N-1 into its own buffer, and writes the result into every peer's buffer
// (process_vm_writev). A second sync tells everyone that all chunks have landed. Chunks
// are disjoint, so no two ordinals ever touch the same bytes of a buffer, and each chunk
// is read (inputs) before it is written (results) by its one owner. Each byte crosses
// between processes once each way with no staging copy in between: about half the memory
// traffic of the staging two-shot, at the price of two system calls per peer per block.
// Needs ptrace-level access between replicas (same user; negotiated once by negotiate_cma).
void all_reduce_cma(Rounds& rounds, int parity, std::byte* data, size_t n_elems, DType dtype,
                    ReduceOp op) {
  const int n = rounds.world_size();
  const int me = rounds.ordinal();
  const size_t elem_bytes = dtype_size(dtype);
  std::vector<std::byte*> peers(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    peers[j] = static_cast<std::byte*>(published_address(rounds, j, parity));
  }
  const size_t chunk = chunk_elems(n_elems, n, elem_bytes);
  const size_t begin = std::min(n_elems, chunk * static_cast<size_t>(me));
  const size_t end = std::min(n_elems, begin + chunk);
  const size_t block_stride = cma_block_bytes(n);
  const size_t block_elems = block_stride / elem_bytes;
  std::vector<std::byte>& temp = rounds.scratch(static_cast<size_t>(n) * block_stride);
  std::vector<const void*>& sources = rounds.sources();
  for (size_t offset = begin; offset < end; offset += block_elems) {
    const size_t bytes = std::min(block_elems, end - offset) * elem_bytes;
    std::byte* own = data + offset * elem_bytes;
    for (int j = 0; j < n; ++j) {
      if (j == me) {
        sources[j] = own;
        continue;
      }
      std::byte* block = temp.data() + static_cast<size_t>(j) * block_stride;
      peer_copy(rounds, true, j, block, peers[j] + offset * elem_bytes, bytes);
      sources[j] = block;
    }
    reduce_sources(own, nullptr, sources.data(), n, bytes / elem_bytes, dtype, op, n);
    for (int j = 0; j < n; ++j) {
      if (j != me) peer_copy(rounds, false, j, own, peers[j] + offset * elem_bytes, bytes);
    }
  }
  rounds.sync();
}

}  // namespace xs::detail
