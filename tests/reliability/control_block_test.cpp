// Control-block validation: garbage in a segment's header, poison words, barrier counters or
// slots (pid, state, mailbox rounds) is reported with the field and value, and a correct job's
// states (including mid-protocol ones) are not. End to end: a replica that scribbles over the
// control block of a running xla-spawn job makes the job fail with that error, within a bound,
// instead of its peers trusting the garbage (run this binary under ASan too: no bad reads).

#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>

#include <gtest/gtest.h>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "xla_spawn/shm/control_block_check.h"
#include "xla_spawn/shm/segment.h"
#include "tests/launcher/launch_support.h"
#include "tests/reliability/job_probe.h"
#include "tests/support/scoped_env.h"

namespace xs::testing {
namespace {

namespace bip = boost::interprocess;
using std::chrono::seconds;

constexpr int kWorldSize = 3;

// A real segment (created as the launcher creates it), mapped read-write for scribbling.
class MappedSegment {
 public:
  MappedSegment()
      : owned_("cbcheck-" + std::to_string(::getpid()) + "-" + unique_tag(), kWorldSize,
               kMinStagingBytes, 0) {
    bip::shared_memory_object object(bip::open_only, owned_.name().c_str(), bip::read_write);
    region_ = bip::mapped_region(object, bip::read_write);
    header_ = SegmentHeader::of(control());
  }
  shm::ControlBlock& control() { return *static_cast<shm::ControlBlock*>(region_.get_address()); }
  shm::OrdinalSlot& slot(int k) {
    return reinterpret_cast<shm::OrdinalSlot*>(static_cast<std::byte*>(region_.get_address()) +
                                               shm::slots_offset())[k];
  }
  std::optional<std::string> check(std::span<const pid_t> pids = {}) {
    return check_segment(region_.get_address(), region_.get_size(), header_, pids);
  }

 private:
  OwnedSegment owned_;
  bip::mapped_region region_;
  SegmentHeader header_;
};

TEST(ControlBlockCheck, FreshAndMidProtocolSegmentsPass) {
  MappedSegment s;
  EXPECT_EQ(s.check(), std::nullopt);
  const pid_t pids[kWorldSize] = {101, 102, 103};
  for (int k = 0; k < kWorldSize; ++k) {
    s.slot(k).pid = pids[k];
    s.slot(k).state = 1;
    s.slot(k).mailbox[0].round = 6;  // posted rounds 5 and 6
    s.slot(k).mailbox[1].round = 5;
  }
  s.slot(2).mailbox[1].round = 7;  // one ordinal already posted round 7
  s.control().barrier_round = 6;
  s.control().barrier_count = 6 * kWorldSize + 1;
  s.control().poison_claim = 1;
  s.control().poisoner_pid = 103;
  s.control().poisoned = 3;  // poisoned by ordinal 2
  EXPECT_EQ(s.check(pids), std::nullopt) << *s.check(pids);
}

struct Scribble {
  std::string name;
  std::function<void(MappedSegment&)> write;
  std::string expect;  // in the message
};
void PrintTo(const Scribble& s, std::ostream* os) {
  *os << s.name;
}

class ControlBlockGarbage : public ::testing::TestWithParam<Scribble> {};

TEST_P(ControlBlockGarbage, IsReportedWithTheFieldAndValue) {
  MappedSegment s;
  GetParam().write(s);
  const pid_t pids[kWorldSize] = {101, 102, 103};
  const std::optional<std::string> bad = s.check(pids);
  ASSERT_TRUE(bad.has_value()) << GetParam().name << " went unnoticed";
  EXPECT_NE(bad->find(GetParam().expect), std::string::npos) << *bad;
}

INSTANTIATE_TEST_SUITE_P(
    Fields, ControlBlockGarbage,
    ::testing::Values(
        Scribble{"Magic", [](auto& s) { s.control().magic = 42; }, "magic 0x2a"},
        Scribble{"WorldSize", [](auto& s) { s.control().world_size = 70000; }, "world size 70000"},
        Scribble{"WorldSizeInRange", [](auto& s) { s.control().world_size = 2; },
                 "expected 20480 for 2 ordinals"},
        Scribble{"StagingBytes", [](auto& s) { s.control().staging_bytes = 12345; },
                 "staging 12345"},
        Scribble{"StagingBytesHuge", [](auto& s) { s.control().staging_bytes = uint64_t{1} << 50; },
                 "staging"},
        Scribble{"ArenaBytes", [](auto& s) { s.control().arena_bytes = 4096 * 1000; }, "total"},
        Scribble{"TotalBytes", [](auto& s) { s.control().total_bytes += 4096; }, "total"},
        Scribble{"JobIdWithoutNul",
                 [](auto& s) { std::memset(s.control().job_id, 'x', shm::kMaxJobIdBytes); },
                 "job id"},
        Scribble{"LauncherPid", [](auto& s) { s.control().launcher_pid = -5; }, "launcher pid -5"},
        Scribble{"Poisoned", [](auto& s) { s.control().poisoned = 99; }, "poisoned word 99"},
        Scribble{"PoisonedWithoutClaim", [](auto& s) { s.control().poisoned = 1; },
                 "poison claim 0"},
        Scribble{"PoisonRecordNotByTheOrdinalItNames",
                 [](auto& s) {
                   s.slot(1).pid = 102;
                   s.slot(1).state = 1;
                   s.control().poison_claim = 1;
                   s.control().poisoner_pid = 101;  // ordinal 0's process claims to be 1
                   s.control().poisoned = 2;
                 },
                 "poison record of ordinal 1 with pid 101: expected that ordinal's pid 102"},
        Scribble{"Sleepers", [](auto& s) { s.control().sleepers = 0xfffffff0u; }, "sleeper count"},
        Scribble{"BarrierCount", [](auto& s) { s.control().barrier_count = 1u << 30; },
                 "barrier arrivals"},
        Scribble{"SlotState", [](auto& s) { s.slot(1).state = 77; }, "ordinal 1: slot state 77"},
        Scribble{"SlotPidOfALiveProcessOutsideTheJob", [](auto& s) { s.slot(2).pid = 1; },
                 "ordinal 2: slot pid 1 "},
        Scribble{"SlotPidAbovePidMax", [](auto& s) { s.slot(2).pid = 0x7badf00d; },
                 "ordinal 2: slot pid 2074996749"},
        Scribble{"SlotCheckedInWithoutPid", [](auto& s) { s.slot(0).state = 1; },
                 "ordinal 0: slot pid 0"},
        Scribble{"MailboxParity", [](auto& s) { s.slot(1).mailbox[0].round = 7; },
                 "ordinal 1: mailbox rounds 7"},
        Scribble{"MailboxRoundsApart",
                 [](auto& s) {
                   s.slot(0).mailbox[0].round = 1000;
                   s.slot(0).mailbox[1].round = 3;
                 },
                 "expected consecutive rounds"}),
    [](const auto& info) { return info.param.name; });

// End to end under xla-spawn: ordinal 1 scribbles and hangs; the job fails fast and says why.
class ScribblingReplica : public ::testing::TestWithParam<std::string> {};

TEST_P(ScribblingReplica, FailsTheJobWithAClearErrorWithinSeconds) {
  ScopedEnv timeout("XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", "20000");
  const auto start = Clock::now();
  const RunResult r = run_xla_spawn({"-n", "3", "--grace-period", "1", "--", corrupt_replica_path(),
                                     "--field", GetParam(), "--victim", "1", "--after", "20"},
                                    seconds(120));
  const double seconds_taken = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("wrote garbage into " + GetParam()), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("is corrupted"), std::string::npos) << r.err;
  // A forged poison record is not believed: nobody fails naming its reason as the cause.
  EXPECT_EQ(r.err.find("poisoned by ordinal 0: forged"), std::string::npos) << r.err;
  // Well before the 20 s collective timeout: the launcher's check runs every 200 ms.
  EXPECT_LT(seconds_taken, 15.0) << r.err;
}

INSTANTIATE_TEST_SUITE_P(Fields, ScribblingReplica,
                         ::testing::Values("magic", "world_size", "staging_bytes", "total_bytes",
                                           "launcher_pid", "launcher_start", "job_id", "poisoned", "poison_claim", "forged_poison",
                                           "sleepers", "barrier_count", "peer_pid", "peer_state",
                                           "peer_round", "arena_bytes", "mailbox_arena_offset"));

}  // namespace
}  // namespace xs::testing
