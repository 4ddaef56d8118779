#pragma once
// A job's shared-memory segment: created (and removed) by the launcher, attached by each
// replica, which checks in under its ordinal. The name is "/xla-spawn-<uid>-<job id>",
// permissions are owner-only (0600).
//
//   const std::string name = xs::create_segment("job42", 8, xs::kDefaultStagingBytes);
//   xs::Segment segment = xs::Segment::attach(name, ordinal, 8, "job42");  // in a replica
//   xs::remove_segment(name);                                              // launcher, at exit
//
// remove_stale_segments() (called by the launcher at start) removes segments of this naming
// scheme whose creating launcher process is gone.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <boost/interprocess/mapped_region.hpp>

#include "xla_spawn/shm/layout.h"

namespace xs {

// Per-ordinal staging default: 2 x 1 MiB halves (a two-shot slab is one half). Sweeping
// 256 KiB .. 8 MiB (all_reduce_sweep --staging-bytes) moved busbw by less than the run-to-run
// noise (+-20%) at N = 2 and N = 8; 2 MiB keeps most messages to a few slabs.
inline constexpr size_t kDefaultStagingBytes = size_t{2} << 20;
inline constexpr size_t kMinStagingBytes = 2 * shm::kPageBytes;
// Per-ordinal buffer arena default (Communicator::alloc_buffer): tmpfs pages are only
// allocated when touched, so an unused arena costs address space, not memory.
inline constexpr size_t kDefaultArenaBytes = size_t{256} << 20;

// "/xla-spawn-<uid>-<job id>". Throws xs::InvalidArgument when job_id is empty, too long, or
// holds characters other than [A-Za-z0-9._-].
std::string segment_name(const std::string& job_id);

// Creates and initialises the job's segment; records the calling process as its launcher.
// staging_bytes and arena_bytes (per ordinal) are rounded up to whole pages; the arenas lie
// shm::arena_stride() apart (so that peers' operands do not alias in the cache). Throws
// xs::InvalidArgument for bad arguments and xs::IoError when the segment exists or shm fails.
std::string create_segment(const std::string& job_id, int world_size, size_t staging_bytes,
                           size_t arena_bytes = kDefaultArenaBytes);

// Removes the segment; false when it did not exist. Attached mappings stay valid until unmapped.
bool remove_segment(const std::string& name);

// Removes this user's xla-spawn segments whose launcher pid is no longer alive. Returns
// the names removed. Segments it cannot read (being created, foreign layout) are left alone.
std::vector<std::string> remove_stale_segments();

// Creates a segment and removes it when destroyed (every exit path of its owner).
class OwnedSegment {
 public:
  OwnedSegment(const std::string& job_id, int world_size, size_t staging_bytes,
               size_t arena_bytes = kDefaultArenaBytes);
  ~OwnedSegment();
  OwnedSegment(const OwnedSegment&) = delete;
  OwnedSegment& operator=(const OwnedSegment&) = delete;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// A replica's mapping of the segment, checked in under its ordinal. Moving is allowed;
// destruction marks the slot as left and unmaps.
class Segment {
 public:
  // Opens `name`, validates it against (world_size, job_id), and checks in as `ordinal`
  // (records this pid). Throws xs::IoError when the segment is missing and
  // xs::InvalidArgument when it belongs to another job or world size, or the ordinal is
  // taken by a live process.
  static Segment attach(const std::string& name, int ordinal, int world_size,
                        const std::string& job_id);

  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&&) = delete;
  Segment(const Segment&) = delete;
  ~Segment();

  const std::string& name() const { return name_; }
  int ordinal() const { return ordinal_; }
  int world_size() const { return world_size_; }
  // Header sizes and flags are read once, at attach, after validation: a peer that rewrites
  // the header later cannot move staging or arena pointers out of the mapping.
  size_t staging_bytes() const { return staging_bytes_; }
  bool spin_allowed() const { return spin_allowed_; }

  shm::ControlBlock& control() const { return *static_cast<shm::ControlBlock*>(base()); }
  shm::OrdinalSlot& slot(int ordinal) const;
  std::byte* staging(int ordinal) const;
  // Ordinal's buffer arena: arena_bytes() bytes at the same offset in every mapping, so a
  // peer finds an operand by its offset from arena(owner).
  size_t arena_bytes() const { return arena_bytes_; }
  std::byte* arena(int ordinal) const;

  // Marks the segment poisoned (first caller wins; its reason is kept) and wakes every
  // sleeper so all replicas fail fast.
  void poison(const std::string& reason) const;
  // "poisoned by ordinal 3: <reason>", or nullopt while healthy.
  std::optional<std::string> poison_message() const;

 private:
  Segment(std::string name, boost::interprocess::mapped_region region, int ordinal, int world_size);
  void* base() const { return region_.get_address(); }

  std::string name_;
  boost::interprocess::mapped_region region_;
  int ordinal_ = 0;
  int world_size_ = 0;
  size_t staging_bytes_ = 0;  // cached header fields, see staging_bytes()
  size_t arena_bytes_ = 0;
  bool spin_allowed_ = false;
};

// Wakes every process sleeping on any futex word of the segment (after a poison).
void wake_all_sleepers(const Segment& segment);

}  // namespace xs
