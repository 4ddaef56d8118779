#include "xla_spawn/shm/segment.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <new>
#include <thread>

#include <fmt/format.h>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/shm/control_block_check.h"
#include "xla_spawn/shm/futex.h"
#include "xla_spawn/shm/stack_dump.h"

namespace xs {
namespace {

namespace bip = boost::interprocess;

constexpr std::string_view kPrefix = "xla-spawn-";

std::string user_prefix() {
  return fmt::format("{}{}-", kPrefix, ::getuid());
}

bool valid_job_id(const std::string& job_id) {
  if (job_id.empty() || job_id.size() >= shm::kMaxJobIdBytes) return false;
  return std::all_of(job_id.begin(), job_id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

// Opens and maps an existing segment; IoError naming the segment when that fails.
bip::mapped_region map_existing(const std::string& name, bip::mode_t mode) {
  try {
    bip::shared_memory_object object(bip::open_only, name.c_str(), mode);
    bip::offset_t size = 0;
    if (!object.get_size(size) || size < static_cast<bip::offset_t>(sizeof(shm::ControlBlock))) {
      throw IoError(
          fmt::format("segment {}: {} bytes, too small to hold a control block "
                      "(not created by xla-spawn, or still being created)",
                      name, size));
    }
    return bip::mapped_region(object, mode);
  } catch (const bip::interprocess_exception& e) {
    throw IoError(
        fmt::format("segment {}: cannot open: {} (is the job still running? the "
                    "launcher removes the segment when the job ends)",
                    name, e.what()));
  }
}

// tmpfs allocates pages on first touch, so a full /dev/shm would surface as a SIGBUS in a
// replica mid-collective. The pages every job touches (control block, slots, staging) are
// reserved here instead, where a failure is an error naming the segment; the arenas stay sparse.
void reserve_touched_pages(int fd, const std::string& name, int world_size, size_t staging_bytes) {
  const size_t bytes = shm::arena_offset(world_size, staging_bytes);
  const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    throw IoError(errno_message(
        fmt::format("segment {}: cannot reserve {} bytes in /dev/shm ({} ordinals x {} staging "
                    "bytes)",
                    name, bytes, world_size, staging_bytes),
        rc));
  }
}

void init_control_block(void* base, const std::string& job_id, int world_size, size_t staging_bytes,
                        size_t arena_bytes, size_t total_bytes) {
  auto* control = new (base) shm::ControlBlock();
  control->version = shm::kSegmentVersion;
  control->world_size = static_cast<uint32_t>(world_size);
  control->staging_bytes = staging_bytes;
  control->total_bytes = total_bytes;
  control->arena_bytes = arena_bytes;
  control->launcher_pid = static_cast<int32_t>(::getpid());
  control->launcher_start = process_start_ticks(::getpid()).value_or(0);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  control->spin_allowed = static_cast<unsigned>(world_size) <= cores ? 1 : 0;
  std::memcpy(control->job_id, job_id.data(), job_id.size());
  auto* slots =
      reinterpret_cast<shm::OrdinalSlot*>(static_cast<std::byte*>(base) + shm::slots_offset());
  for (int i = 0; i < world_size; ++i) new (&slots[i]) shm::OrdinalSlot();
  // Published last: a reader that sees the magic sees an initialised block.
  control->magic.store(shm::kSegmentMagic, std::memory_order_release);
}

void validate(const shm::ControlBlock& control, const std::string& name, int world_size,
              const std::string& job_id, size_t mapped_bytes) {
  if (control.magic.load(std::memory_order_acquire) != shm::kSegmentMagic) {
    throw InvalidArgument(
        fmt::format("segment {}: not an initialised xla-spawn segment of "
                    "version {}",
                    name, shm::kSegmentVersion));
  }
  if (control.version != shm::kSegmentVersion) {
    throw InvalidArgument(fmt::format(
        "segment {} has layout version {}, this replica's xla-spawn library reads version {}: "
        "the launcher and the program were built from different xla-spawn versions",
        name, control.version, shm::kSegmentVersion));
  }
  const std::string owner(control.job_id, strnlen(control.job_id, shm::kMaxJobIdBytes));
  if (owner != job_id) {
    throw InvalidArgument(fmt::format("segment {} belongs to job '{}', this replica is in job '{}'",
                                      name, owner, job_id));
  }
  if (static_cast<int>(control.world_size) != world_size) {
    throw InvalidArgument(
        fmt::format("segment {} was created for world size {}, this replica "
                    "has world size {}",
                    name, control.world_size, world_size));
  }
  const size_t layout_bytes =
      shm::segment_bytes(world_size, control.staging_bytes, control.arena_bytes);
  XS_CHECK(control.total_bytes == layout_bytes,
           "segment {}: header says {} bytes, its staging and arena sizes need {}", name,
           control.total_bytes, layout_bytes);
  XS_CHECK(control.total_bytes <= mapped_bytes, "segment {}: header says {} bytes, mapped {}", name,
           control.total_bytes, mapped_bytes);
  if (auto bad = check_header(control, mapped_bytes)) {
    throw PeerFailure(fmt::format("segment {}: corrupted header: {}", name, *bad));
  }
}

void check_in(shm::OrdinalSlot& slot, const std::string& name, int ordinal) {
  const int32_t me = static_cast<int32_t>(::getpid());
  int32_t seen = slot.pid.load(std::memory_order_acquire);
  while (seen != me) {
    if (seen != 0 && process_alive(seen)) {
      // A replica's child (a forked worker, a subprocess handed the environment) is no
      // replica: only the process xla-spawn started joins as its ordinal.
      const bool parent = seen == static_cast<int32_t>(::getppid());
      throw InvalidArgument(fmt::format(
          "segment {}: ordinal {} is already checked in by live pid {}{}", name, ordinal, seen,
          parent ? " (this process's parent: a replica's child cannot join its job; only the "
                   "replica itself calls init)"
                 : ""));
    }
    if (slot.pid.compare_exchange_weak(seen, me, std::memory_order_acq_rel)) break;
  }
  slot.call.dumps_stack.store(install_stack_dump() ? 1 : 0, std::memory_order_relaxed);
  slot.state.store(static_cast<uint32_t>(shm::SlotState::kCheckedIn), std::memory_order_release);
}

}  // namespace

std::string segment_name(const std::string& job_id) {
  XS_CHECK_ARG(valid_job_id(job_id), "job id '{}': expected 1..{} characters from [A-Za-z0-9._-]",
               job_id, shm::kMaxJobIdBytes - 1);
  return fmt::format("/{}{}", user_prefix(), job_id);
}

std::string create_segment(const std::string& job_id, int world_size, size_t staging_bytes,
                           size_t arena_bytes) {
  const std::string name = segment_name(job_id);
  XS_CHECK_ARG(world_size >= 1 && world_size <= shm::kMaxWorldSize,
               "create_segment: world size {} outside 1..{}", world_size, shm::kMaxWorldSize);
  XS_CHECK_ARG(staging_bytes >= kMinStagingBytes,
               "create_segment: staging {} bytes per ordinal, need at least {}", staging_bytes,
               kMinStagingBytes);
  staging_bytes = shm::round_up(staging_bytes, shm::kPageBytes);
  arena_bytes = shm::round_up(arena_bytes, shm::kPageBytes);
  const size_t total = shm::segment_bytes(world_size, staging_bytes, arena_bytes);
  bool created = false;  // from here on, a failure removes the half-made segment
  try {
    bip::permissions owner_only;
    owner_only.set_permissions(0600);
    bip::shared_memory_object object(bip::create_only, name.c_str(), bip::read_write, owner_only);
    created = true;
    object.truncate(static_cast<bip::offset_t>(total));
    reserve_touched_pages(object.get_mapping_handle().handle, name, world_size, staging_bytes);
    bip::mapped_region region(object, bip::read_write);
    init_control_block(region.get_address(), job_id, world_size, staging_bytes, arena_bytes,
                       total);
  } catch (const bip::interprocess_exception& e) {
    if (created) remove_segment(name);
    throw IoError(
        fmt::format("segment {}: cannot create {} bytes ({} ordinals x {} staging "
                    "bytes + {} arena bytes): {}",
                    name, total, world_size, staging_bytes, arena_bytes, e.what()));
  } catch (...) {
    if (created) remove_segment(name);
    throw;
  }
  return name;
}

bool remove_segment(const std::string& name) {
  return bip::shared_memory_object::remove(name.c_str());
}

std::vector<std::string> remove_stale_segments() {
  std::vector<std::string> removed;
  const std::string prefix = user_prefix();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(prefix, 0) != 0) continue;
    const std::string name = fmt::format("/{}", file);
    // Only regular files of this user's, big enough for a control block, are opened: anyone
    // can create names under the prefix in /dev/shm, and opening a FIFO planted there blocks
    // for ever, a symlink leads elsewhere, another user's file is not ours to judge. /dev/shm
    // is sticky, so a file this user owns cannot be swapped by another before the open.
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != ::getuid() || st.st_size < static_cast<off_t>(sizeof(shm::ControlBlock))) {
      continue;
    }
    try {
      const bip::mapped_region region = map_existing(name, bip::read_only);
      const auto& control = *static_cast<const shm::ControlBlock*>(region.get_address());
      if (control.magic.load(std::memory_order_acquire) != shm::kSegmentMagic) continue;
      // Alive and the same process (a pid reused by another is not the launcher); when the
      // start time cannot be read, a live pid is taken for the launcher.
      // A segment of an older version, or whose launcher could not read its own start time,
      // has no usable launcher_start: a live pid is then taken for its launcher.
      const pid_t pid = control.launcher_pid;
      const bool has_start = control.version >= 3 && control.launcher_start != 0;
      const std::optional<uint64_t> start = has_start ? process_start_ticks(pid) : std::nullopt;
      if (process_alive(pid) && (!start || *start == control.launcher_start)) continue;
    } catch (const Error&) {
      continue;  // unreadable or half-created: not provably stale, leave it
    }
    if (remove_segment(name)) removed.push_back(name);
  }
  return removed;
}

OwnedSegment::OwnedSegment(const std::string& job_id, int world_size, size_t staging_bytes,
                           size_t arena_bytes)
    : name_(create_segment(job_id, world_size, staging_bytes, arena_bytes)) {}

OwnedSegment::~OwnedSegment() {
  remove_segment(name_);
}

Segment Segment::attach(const std::string& name, int ordinal, int world_size,
                        const std::string& job_id) {
  XS_CHECK_ARG(ordinal >= 0 && ordinal < world_size,
               "segment {}: ordinal {} outside 0..{} (world size {})", name, ordinal,
               world_size - 1, world_size);
  bip::mapped_region region = map_existing(name, bip::read_write);
  const auto& control = *static_cast<const shm::ControlBlock*>(region.get_address());
  validate(control, name, world_size, job_id, region.get_size());
  Segment segment(name, std::move(region), ordinal, world_size);
  check_in(segment.slot(ordinal), name, ordinal);
  return segment;
}

Segment::Segment(std::string name, bip::mapped_region region, int ordinal, int world_size)
    : name_(std::move(name)),
      region_(std::move(region)),
      ordinal_(ordinal),
      world_size_(world_size),
      staging_bytes_(control().staging_bytes),
      arena_bytes_(control().arena_bytes),
      spin_allowed_(control().spin_allowed != 0) {}

Segment::Segment(Segment&& other) noexcept
    : name_(std::move(other.name_)),
      region_(std::move(other.region_)),
      ordinal_(other.ordinal_),
      world_size_(other.world_size_),
      staging_bytes_(other.staging_bytes_),
      arena_bytes_(other.arena_bytes_),
      spin_allowed_(other.spin_allowed_) {
  other.world_size_ = 0;
}

Segment::~Segment() {
  if (world_size_ == 0 || base() == nullptr) return;
  // A child forked from the replica inherits this object; its exit must not check the replica
  // out.
  if (slot(ordinal_).pid.load(std::memory_order_acquire) != ::getpid()) return;
  slot(ordinal_).state.store(static_cast<uint32_t>(shm::SlotState::kLeft),
                             std::memory_order_release);
}

shm::OrdinalSlot& Segment::slot(int ordinal) const {
  auto* slots =
      reinterpret_cast<shm::OrdinalSlot*>(static_cast<std::byte*>(base()) + shm::slots_offset());
  return slots[ordinal];
}

std::byte* Segment::staging(int ordinal) const {
  return static_cast<std::byte*>(base()) + shm::staging_offset(world_size_) +
         staging_bytes_ * static_cast<size_t>(ordinal);
}

std::byte* Segment::arena(int ordinal) const {
  return static_cast<std::byte*>(base()) + shm::arena_offset(world_size_, staging_bytes_) +
         shm::arena_stride(arena_bytes_) * static_cast<size_t>(ordinal);
}

void Segment::poison(const std::string& reason) const {
  shm::ControlBlock& control = this->control();
  uint32_t expected = 0;
  if (control.poison_claim.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    control.poisoner_pid.store(static_cast<int32_t>(::getpid()), std::memory_order_relaxed);
    const size_t n = std::min(reason.size(), shm::kPoisonReasonBytes - 1);
    std::memcpy(control.poison_reason, reason.data(), n);
    control.poison_reason[n] = '\0';
    control.poisoned.store(static_cast<uint32_t>(ordinal_ + 1), std::memory_order_seq_cst);
  }
  wake_all_sleepers(*this);
}

std::optional<std::string> Segment::poison_message() const {
  const uint32_t poisoner = control().poisoned.load(std::memory_order_acquire);
  if (poisoner == 0) return std::nullopt;
  // A record another process wrote (a replica scribbling over the control block) names an
  // ordinal whose checked-in pid is not the record's: reported as corruption, not believed.
  const int32_t pid = control().poisoner_pid.load(std::memory_order_relaxed);
  const uint32_t ordinal = poisoner - 1;
  const int32_t slot_pid = ordinal < static_cast<uint32_t>(world_size())
                               ? slot(static_cast<int>(ordinal)).pid.load(std::memory_order_acquire)
                               : -1;
  if (pid <= 0 || pid != slot_pid) {
    return fmt::format(
        "the control block is corrupted: a poison record names ordinal {} and pid {}, but that "
        "ordinal checked in as pid {}",
        ordinal, pid, slot_pid);
  }
  const std::string reason(control().poison_reason,
                           strnlen(control().poison_reason, shm::kPoisonReasonBytes));
  return fmt::format("segment poisoned by ordinal {}: {}", ordinal, reason);
}

void wake_all_sleepers(const Segment& segment) {
  futex_wake_all(&segment.control().barrier_round);
  for (int i = 0; i < segment.world_size(); ++i) {
    shm::OrdinalSlot& slot = segment.slot(i);
    futex_wake_all(&slot.mailbox[0].round);
    futex_wake_all(&slot.mailbox[1].round);
    futex_wake_all(&slot.ring_sent.value);
    futex_wake_all(&slot.ring_acked.value);
  }
}

}  // namespace xs
