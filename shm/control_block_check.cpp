#include "xla_spawn/shm/control_block_check.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

namespace xs {
namespace {

// Threads of all replicas inside futex_wait at once: far above any real job (a replica has
// one or two waiting threads), far below the garbage a scribble leaves.
constexpr uint32_t kMaxSleepers = 64 * shm::kMaxWorldSize;

// Header fields are plain data written once; a hostile peer may rewrite them concurrently,
// so they are read with relaxed atomic loads (no torn reads, no data race for sanitizers).
// PID_MAX_LIMIT on 64-bit Linux: no pid is larger.
constexpr int32_t kMaxPid = int32_t{1} << 22;

// The parent of a live process, from /proc/<pid>/stat; -1 when it does not exist.
pid_t parent_of(pid_t pid) {
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return -1;
  char buffer[512];
  const size_t n = std::fread(buffer, 1, sizeof buffer - 1, f);
  std::fclose(f);
  buffer[n] = '\0';
  const char* close = std::strrchr(buffer, ')');  // the name may hold spaces and ')'
  char state = 0;
  int ppid = -1;
  if (close == nullptr || std::sscanf(close + 1, " %c %d", &state, &ppid) != 2) return -1;
  return static_cast<pid_t>(ppid);
}

}  // namespace

bool of_replica(pid_t pid, pid_t replica) {
  const pid_t self = ::getpid();
  for (int depth = 0; depth < 64 && pid > 1; ++depth) {  // 64: deeper trees are not wrappers
    // A wrapper's child outlives it adopted by the caller, the launcher (the job's subreaper).
    if (pid == replica || (depth > 0 && pid == self)) return true;
    const pid_t parent = parent_of(pid);
    if (parent < 0) return depth == 0;  // the slot's process is gone (or vanished mid-walk)
    pid = parent;
  }
  return false;
}

namespace {

template <class T>
T load(const T& field) {
  return __atomic_load_n(&field, __ATOMIC_RELAXED);
}
template <class T>
T load(const std::atomic<T>& field) {
  return field.load(std::memory_order_acquire);
}

std::string at(const void* base, const void* field, const std::string& what) {
  return fmt::format("{} (segment offset {})", what,
                     static_cast<const std::byte*>(field) - static_cast<const std::byte*>(base));
}

bool same_header(const SegmentHeader& a, const SegmentHeader& b) {
  return a.job_id == b.job_id && a.world_size == b.world_size &&
         a.staging_bytes == b.staging_bytes && a.arena_bytes == b.arena_bytes &&
         a.total_bytes == b.total_bytes && a.launcher_pid == b.launcher_pid &&
         a.spin_allowed == b.spin_allowed && a.launcher_start == b.launcher_start;
}

std::string describe(const SegmentHeader& h) {
  return fmt::format(
      "job '{}', world size {}, staging {} B, arena {} B, total {} B, launcher pid {}, spin {}",
      h.job_id, h.world_size, h.staging_bytes, h.arena_bytes, h.total_bytes, h.launcher_pid,
      h.spin_allowed);
}

std::optional<std::string> check_poison(const shm::ControlBlock& c, int world_size) {
  // poisoned before claim: a writer sets claim, then poisoned; so poisoned != 0 implies claim.
  const uint32_t poisoned = load(c.poisoned);
  const uint32_t claim = load(c.poison_claim);
  if (poisoned > static_cast<uint32_t>(world_size)) {
    return at(
        &c, &c.poisoned,
        fmt::format("poisoned word {}: expected 0 or 1 + an ordinal < {}", poisoned, world_size));
  }
  if (claim > 1 || (poisoned != 0 && claim != 1)) {
    return at(&c, &c.poison_claim,
              fmt::format("poison claim {} with poisoned word {}: expected 0 or 1, and 1 once "
                          "poisoned",
                          claim, poisoned));
  }
  const uint32_t sleepers = load(c.sleepers);
  if (sleepers > kMaxSleepers) {
    return at(&c, &c.sleepers,
              fmt::format("sleeper count {}: expected at most {}", sleepers, kMaxSleepers));
  }
  // Arrivals only grow and the round is published after its last arrival: reading the round
  // first gives count >= round * n; reading the count first gives count <= (round + 1) * n.
  const uint64_t round_before = load(c.barrier_round);
  const uint64_t count = load(c.barrier_count);
  const uint64_t round_after = load(c.barrier_round);
  const uint64_t n = static_cast<uint64_t>(world_size);
  if (count < round_before * n || count > (round_after + 1) * n) {
    return at(&c, &c.barrier_count,
              fmt::format("barrier arrivals {} with barrier round {}..{}: expected between "
                          "round x {} and (round + 1) x {}",
                          count, round_before, round_after, n, n));
  }
  return std::nullopt;
}

// Round r is posted into mailbox r % 2, and an ordinal posts r + 1 only after r: mailbox 0
// holds an even round, mailbox 1 an odd one (or 0 before the first), one apart. `a` is
// re-read: if it did not move, `b` was read while the owner posted at most one round.
std::optional<std::string> check_mailboxes(const void* base, const shm::OrdinalSlot& slot,
                                           int ordinal) {
  const uint32_t a = load(slot.mailbox[0].round);
  const uint32_t b = load(slot.mailbox[1].round);
  const uint32_t a_again = load(slot.mailbox[0].round);
  if ((a & 1u) != 0 || (b != 0 && (b & 1u) != 1)) {
    return at(base, &slot.mailbox[0],
              fmt::format("ordinal {}: mailbox rounds {} and {}: expected an even round in "
                          "mailbox 0 and an odd one (or 0) in mailbox 1",
                          ordinal, a, b));
  }
  const uint32_t ahead = b - a, behind = a - b;  // modulo 2^32, like the rounds themselves
  if (a == a_again && ahead != 1 && behind != 1 && !(a == 0 && b == 0)) {
    return at(base, &slot.mailbox[0],
              fmt::format("ordinal {}: mailbox rounds {} and {}: expected consecutive rounds",
                          ordinal, a, b));
  }
  return std::nullopt;
}

std::optional<std::string> check_slot(const void* base, const shm::OrdinalSlot& slot, int ordinal,
                                      std::span<const pid_t> pids) {
  // state before pid: check-in stores the pid, then the state.
  const uint32_t state = load(slot.state);
  const int32_t pid = load(slot.pid);
  if (state > static_cast<uint32_t>(shm::SlotState::kLeft)) {
    return at(base, &slot.state,
              fmt::format("ordinal {}: slot state {}: expected 0 (empty), 1 (checked in) or "
                          "2 (left)",
                          ordinal, state));
  }
  const bool known =
      pids.empty() || pid == 0 || of_replica(pid, pids[static_cast<size_t>(ordinal)]);
  if (pid < 0 || pid > kMaxPid || !known || (state != 0 && pid == 0)) {
    return at(
        base, &slot.pid,
        fmt::format("ordinal {}: slot pid {} in state {}: expected 0 or the replica's pid {} "
                    "(or a descendant), and a pid once checked in",
                    ordinal, pid, state, pids.empty() ? -1 : pids[static_cast<size_t>(ordinal)]));
  }
  return check_mailboxes(base, slot, ordinal);
}

}  // namespace

SegmentHeader SegmentHeader::of(const shm::ControlBlock& control) {
  SegmentHeader h;
  char job_id[shm::kMaxJobIdBytes];
  for (size_t i = 0; i < sizeof job_id; ++i) job_id[i] = load(control.job_id[i]);
  h.job_id.assign(job_id, strnlen(job_id, sizeof job_id));
  h.world_size = static_cast<int>(load(control.world_size));
  h.staging_bytes = load(control.staging_bytes);
  h.arena_bytes = load(control.arena_bytes);
  h.total_bytes = load(control.total_bytes);
  h.launcher_pid = load(control.launcher_pid);
  h.spin_allowed = load(control.spin_allowed);
  h.launcher_start = load(control.launcher_start);
  return h;
}

std::optional<std::string> check_header(const shm::ControlBlock& c, size_t mapped_bytes) {
  if (mapped_bytes < sizeof(shm::ControlBlock)) {
    return fmt::format("mapping of {} bytes: expected at least a control block ({} bytes)",
                       mapped_bytes, sizeof(shm::ControlBlock));
  }
  const uint64_t magic = load(c.magic);
  const uint32_t version = load(c.version);
  if (magic != shm::kSegmentMagic || version != shm::kSegmentVersion) {
    return at(&c, &c.magic,
              fmt::format("magic {:#x} version {}: expected {:#x} version {}", magic, version,
                          shm::kSegmentMagic, shm::kSegmentVersion));
  }
  const SegmentHeader h = SegmentHeader::of(c);
  if (h.world_size < 1 || h.world_size > shm::kMaxWorldSize) {
    return at(&c, &c.world_size,
              fmt::format("world size {}: expected 1..{}", h.world_size, shm::kMaxWorldSize));
  }
  if (h.staging_bytes % shm::kPageBytes != 0 || h.staging_bytes < 2 * shm::kPageBytes ||
      h.staging_bytes > (uint64_t{1} << 40)) {
    return at(&c, &c.staging_bytes,
              fmt::format("staging {} bytes per ordinal: expected a multiple of {} in [{}, 2^40]",
                          h.staging_bytes, shm::kPageBytes, 2 * shm::kPageBytes));
  }
  if (h.arena_bytes % shm::kPageBytes != 0 || h.arena_bytes > (uint64_t{1} << 40)) {
    return at(&c, &c.arena_bytes,
              fmt::format("arena {} bytes per ordinal: expected a multiple of {} up to 2^40",
                          h.arena_bytes, shm::kPageBytes));
  }
  const uint64_t want = shm::segment_bytes(h.world_size, h.staging_bytes, h.arena_bytes);
  if (h.total_bytes != want || h.total_bytes > mapped_bytes) {
    return at(&c, &c.total_bytes,
              fmt::format("total {} bytes: expected {} for {} ordinals x ({} staging + {} arena "
                          "bytes), within the {} bytes mapped",
                          h.total_bytes, want, h.world_size, h.staging_bytes, h.arena_bytes,
                          mapped_bytes));
  }
  const void* nul = std::memchr(c.job_id, '\0', sizeof c.job_id);
  if (nul == nullptr || h.job_id.empty()) {
    return at(&c, &c.job_id,
              fmt::format("job id: expected 1..{} characters and a NUL", shm::kMaxJobIdBytes - 1));
  }
  if (h.launcher_pid <= 0 || h.spin_allowed > 1) {
    return at(&c, &c.launcher_pid,
              fmt::format("launcher pid {} spin flag {}: expected a pid > 0 and 0 or 1",
                          h.launcher_pid, h.spin_allowed));
  }
  return std::nullopt;
}

std::optional<std::string> check_segment(const void* base, size_t mapped_bytes,
                                         const SegmentHeader& expected,
                                         std::span<const pid_t> pids) {
  const auto& control = *static_cast<const shm::ControlBlock*>(base);
  if (auto bad = check_header(control, mapped_bytes)) return bad;
  const SegmentHeader now = SegmentHeader::of(control);
  if (!same_header(now, expected)) {
    return fmt::format("header changed after creation: now {}; created as {}", describe(now),
                       describe(expected));
  }
  if (auto bad = check_poison(control, expected.world_size)) return bad;
  const auto* slots = reinterpret_cast<const shm::OrdinalSlot*>(
      static_cast<const std::byte*>(base) + shm::slots_offset());
  for (int k = 0; k < expected.world_size; ++k) {
    if (auto bad = check_slot(base, slots[k], k, pids)) return bad;
  }
  // The poison record's pid is the process that checked in as the ordinal it names (the
  // slot's pid was just checked to be of that replica): another writer is not believed.
  if (const uint32_t poisoned = load(control.poisoned); poisoned != 0) {
    const int32_t pid = load(control.poisoner_pid);
    const int32_t slot_pid = load(slots[poisoned - 1].pid);
    if (pid <= 0 || pid != slot_pid) {
      return at(base, &control.poisoner_pid,
                fmt::format("poison record of ordinal {} with pid {}: expected that ordinal's "
                            "pid {}",
                            poisoned - 1, pid, slot_pid));
    }
  }
  return std::nullopt;
}

}  // namespace xs
