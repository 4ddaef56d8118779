#pragma once
// Validation of a job segment's control block and ordinal slots against invariants a correct
// job never breaks, so that garbage written into shared memory (a buggy or hostile replica, a
// stray write) is reported as a clear error instead of being trusted into out-of-bounds reads,
// signals to arbitrary pids or endless waits. Read-only; every read stays inside the mapping.
//
//   if (auto bad = xs::check_header(control, mapped_bytes)) throw xs::PeerFailure(*bad);
//   if (auto bad = xs::check_segment(base, mapped_bytes, expected, pids)) stop_job(*bad);
//
// The checks tolerate concurrent updates by running replicas: each pair of fields is read in
// the order that makes its invariant hold for every interleaving of correct writers.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "xla_spawn/shm/layout.h"

namespace xs {

// What the creator wrote into the header (create_segment's arguments and the launcher pid).
struct SegmentHeader {
  std::string job_id;
  int world_size = 0;
  uint64_t staging_bytes = 0;  // per ordinal, page multiple
  uint64_t arena_bytes = 0;    // per ordinal, page multiple, may be 0
  uint64_t total_bytes = 0;
  int32_t launcher_pid = 0;
  uint32_t spin_allowed = 0;
  uint64_t launcher_start = 0;

  static SegmentHeader of(const shm::ControlBlock& control);  // a snapshot of the header
};

// Self-consistency of the write-once header, needing no outside knowledge: magic, version,
// world size 1..1024, staging size (a page multiple >= 2 pages), arena size (a page multiple),
// total size == segment_bytes(world size, staging, arena) <= mapped_bytes, NUL-terminated job id,
// launcher pid > 0, spin flag 0/1. Returns "<field> <value>: expected <what>" for the first
// violation.
std::optional<std::string> check_header(const shm::ControlBlock& control, size_t mapped_bytes);

// Whether `pid` is, or was, a process of the replica `replica`: the replica itself or a
// descendant that attached (xla-spawn -- gdb/sh -c ... train). A process that no longer
// exists cannot be told apart from a dead replica and passes; a live process outside the
// replica's tree (another job, an unrelated program) does not. A process the caller (the
// launcher, the job's subreaper) adopted when its parent in the replica's tree exited passes.
bool of_replica(pid_t pid, pid_t replica);

// Everything: check_header, the header equal to `expected`, the poison words (poisoner <=
// world size, claim 0/1 and set when poisoned, the record's pid the poisoner's slot pid), the
// sleeper count, the central barrier
// counters, and per slot: state 0..2, a checked-in slot has a pid, the pid is 0 or a process
// of that ordinal's replica (when `pids` is non-empty, pids[k] is ordinal k's process: it or a
// live descendant of it; a pid that no longer exists passes), mailbox round
// parity (round r lives in mailbox r % 2) and the two mailboxes within one round of each other.
// `base` is the segment's start, valid for mapped_bytes. Message names the segment offset too.
std::optional<std::string> check_segment(const void* base, size_t mapped_bytes,
                                         const SegmentHeader& expected,
                                         std::span<const pid_t> pids);

}  // namespace xs
