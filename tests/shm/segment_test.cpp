#include "shm/segment.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include <fmt/format.h>

#include "base/error.h"

namespace xs {
namespace {

constexpr size_t kStaging = 64 << 10;

std::string job_id() {
  static std::atomic<int> counter{0};
  return fmt::format("shmtest{}-{}", ::getpid(), counter++);
}

bool exists(const std::string& name) {
  return std::filesystem::exists("/dev/shm" + name);
}

TEST(SegmentTest, NameIsUniqueToUserAndJobAndRecognisable) {
  EXPECT_EQ(segment_name("job-7"), fmt::format("/xla-spawn-{}-job-7", ::getuid()));
  EXPECT_THROW(segment_name(""), InvalidArgument);
  EXPECT_THROW(segment_name("a/b"), InvalidArgument);
  EXPECT_THROW(segment_name(std::string(200, 'x')), InvalidArgument);
}

TEST(SegmentTest, CreatedOwnerOnlyAndRemovedByItsOwner) {
  std::string name;
  {
    OwnedSegment segment(job_id(), 4, kStaging);
    name = segment.name();
    struct stat st {};
    ASSERT_EQ(::stat(("/dev/shm" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_GE(static_cast<size_t>(st.st_size), 4 * kStaging);
  }
  EXPECT_FALSE(exists(name));
  EXPECT_FALSE(remove_segment(name));
}

TEST(SegmentTest, CreatingTheSameJobTwiceFails) {
  const std::string id = job_id();
  OwnedSegment segment(id, 2, kStaging);
  EXPECT_THROW(create_segment(id, 2, kStaging), IoError);
}

TEST(SegmentTest, AttachChecksInAndExposesTheLayout) {
  const std::string id = job_id();
  OwnedSegment owned(id, 3, kStaging);
  Segment segment = Segment::attach(owned.name(), 1, 3, id);
  EXPECT_EQ(segment.ordinal(), 1);
  EXPECT_EQ(segment.world_size(), 3);
  EXPECT_EQ(segment.staging_bytes(), kStaging);
  EXPECT_EQ(segment.slot(1).pid.load(), ::getpid());
  EXPECT_EQ(segment.slot(0).pid.load(), 0);
  EXPECT_EQ(segment.staging(2) - segment.staging(1), static_cast<ptrdiff_t>(kStaging));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(&segment.slot(2)) % 64, 0u);
}

// The buffer arenas (Communicator::alloc_buffer) follow the staging areas, one per ordinal,
// page-rounded, and a write at the end of the last one stays inside the mapping.
TEST(SegmentTest, ArenasFollowTheStagingOnePerOrdinalAndAreSharedByEveryMapping) {
  const std::string id = job_id();
  OwnedSegment owned(id, 3, kStaging, 10'000);
  Segment mine = Segment::attach(owned.name(), 0, 3, id);
  Segment peer = Segment::attach(owned.name(), 2, 3, id);
  EXPECT_EQ(mine.arena_bytes(), 12'288u);
  EXPECT_EQ(mine.arena(0), mine.staging(2) + kStaging);
  EXPECT_EQ(mine.arena(2) - mine.arena(1), static_cast<ptrdiff_t>(12'288));
  mine.arena(2)[12'287] = std::byte{42};
  EXPECT_EQ(peer.arena(2)[12'287], std::byte{42}) << "arenas are shared memory";
  const std::string id_none = job_id();
  OwnedSegment none(id_none, 2, kStaging, 0);
  EXPECT_EQ(Segment::attach(none.name(), 0, 2, id_none).arena_bytes(), 0u);
}

TEST(SegmentTest, AttachFailsClearlyWhenMissingOrOfAnotherJobOrWorldSize) {
  const std::string id = job_id();
  OwnedSegment owned(id, 2, kStaging);
  try {
    Segment::attach(segment_name("no-such-job"), 0, 2, "no-such-job");
    FAIL() << "attached a missing segment";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-job"), std::string::npos) << e.what();
  }
  try {
    Segment::attach(owned.name(), 0, 2, "other-job");
    FAIL() << "attached another job's segment";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("other-job"), std::string::npos) << e.what();
  }
  try {
    Segment::attach(owned.name(), 0, 4, id);
    FAIL() << "attached with the wrong world size";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("world size 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Segment::attach(owned.name(), 2, 2, id), InvalidArgument);
}

TEST(SegmentTest, AnOrdinalHeldByALiveProcessCannotBeTakenAgain) {
  const std::string id = job_id();
  OwnedSegment owned(id, 2, kStaging);
  Segment first = Segment::attach(owned.name(), 0, 2, id);
  // Same process attaching again is allowed (it is the same replica); a different live pid
  // is not: fake one with the parent's pid.
  first.slot(0).pid.store(static_cast<int32_t>(::getppid()));
  EXPECT_THROW(Segment::attach(owned.name(), 0, 2, id), InvalidArgument);
}

TEST(SegmentTest, PoisonKeepsTheFirstReason) {
  const std::string id = job_id();
  OwnedSegment owned(id, 2, kStaging);
  Segment segment = Segment::attach(owned.name(), 1, 2, id);
  EXPECT_FALSE(segment.poison_message());
  segment.poison("first");
  segment.poison("second");
  EXPECT_EQ(*segment.poison_message(), "segment poisoned by ordinal 1: first");
}

TEST(SegmentTest, StaleSegmentsOfDeadLaunchersAreRemovedLiveOnesKept) {
  const std::string live_id = job_id();
  const std::string dead_id = job_id();
  OwnedSegment live(live_id, 2, kStaging);
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      create_segment(dead_id, 2, kStaging);  // a "launcher" that dies without cleaning up
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string dead_name = segment_name(dead_id);
  ASSERT_TRUE(exists(dead_name));
  const std::vector<std::string> removed = remove_stale_segments();
  EXPECT_NE(std::find(removed.begin(), removed.end(), dead_name), removed.end());
  EXPECT_FALSE(exists(dead_name));
  EXPECT_TRUE(exists(live.name()));
}

}  // namespace
}  // namespace xs
