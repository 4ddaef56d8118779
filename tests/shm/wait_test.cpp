#include "xla_spawn/shm/wait.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "tests/support/scoped_env.h"
#include "xla_spawn/shm/futex.h"

namespace xs {
namespace {

constexpr size_t kStaging = 64 << 10;

std::string job_id() {
  static int counter = 0;
  return fmt::format("waittest{}-{}", ::getpid(), counter++);
}

// Waits for ordinal 1's ring_sent word to reach 1.
Awaited ordinal_one_sent(const Segment& segment) {
  const auto& word = segment.slot(1).ring_sent.value;
  if (word.load(std::memory_order_acquire) >= 1) return {};
  return {&word, 1};
}

TEST(WaitTest, TimesOutNamingTheAwaitedOrdinalAndPoisons) {
  const std::string id = job_id();
  OwnedSegment owned(id, 2, kStaging);
  Segment segment = Segment::attach(owned.name(), 0, 2, id);
  Waiter waiter(segment, 200);
  const auto start = std::chrono::steady_clock::now();
  try {
    waiter.wait("test_op", [&] { return ordinal_one_sent(segment); });
    FAIL() << "no timeout";
  } catch (const Timeout& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("test_op"), std::string::npos) << what;
    EXPECT_NE(what.find("ordinal 1 (never checked in)"), std::string::npos) << what;
    // The time it reports: at least the timeout, at most what this test saw (a loaded machine
    // may take longer than 0.2 s to notice).
    const size_t at = what.find("timed out after ");
    ASSERT_NE(at, std::string::npos) << what;
    const double reported = std::stod(what.substr(at + std::strlen("timed out after ")));
    const double seen =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GE(reported, 0.2) << what;
    EXPECT_LE(reported, seen + 0.001) << what;
    EXPECT_NE(what.find("(timeout 200 ms"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(segment.poison_message());
}

// Both spin variables are checked whichever one this segment uses (whether replicas
// outnumber cores), so that a typo is an error on every machine.
TEST(WaitTest, ABadSpinOrYieldValueIsAnErrorWhicheverApplies) {
  const std::string id = job_id();
  OwnedSegment owned(id, 2, kStaging);
  Segment segment = Segment::attach(owned.name(), 0, 2, id);
  for (const char* name : {"XLA_SPAWN_SPIN_US", "XLA_SPAWN_YIELD_US"}) {
    testing::ScopedEnv bad(name, "abc");
    try {
      Waiter waiter(segment, 200);
      ADD_FAILURE() << name << "=abc accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

TEST(WaitTest, ReturnsWhenAnotherProcessPublishes) {
  const std::string id = job_id();
  OwnedSegment owned(id, 2, kStaging);
  Segment segment = Segment::attach(owned.name(), 0, 2, id);
  const pid_t pid = ::fork();
  if (pid == 0) {
    Segment peer = Segment::attach(owned.name(), 1, 2, id);
    ::usleep(20'000);  // make the parent go to sleep on the futex first
    publish(peer, peer.slot(1).ring_sent.value, 1);
    ::_exit(0);
  }
  Waiter waiter(segment, 10'000);
  EXPECT_NO_THROW(waiter.wait("test_op", [&] { return ordinal_one_sent(segment); }));
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// Time a waiter spends stopped (SIGSTOP; Ctrl-Z stops the whole job) is not waiting: stopped
// for twice the timeout and continued, it still sees its peer publish (issue 20, finding 7).
TEST(WaitTest, TimeSpentStoppedDoesNotCountTowardsTheTimeout) {
  const std::string id = job_id();
  OwnedSegment owned(id, 2, kStaging);
  Segment peer = Segment::attach(owned.name(), 1, 2, id);
  const pid_t pid = ::fork();
  if (pid == 0) {
    Segment segment = Segment::attach(owned.name(), 0, 2, id);
    Waiter waiter(segment, 1500);
    try {
      waiter.wait("test_op", [&] { return ordinal_one_sent(segment); });
      ::_exit(0);
    } catch (const Timeout&) {
      ::_exit(3);
    } catch (...) {
      ::_exit(4);
    }
  }
  // Until the child sleeps on the futex (bounded: 10 s).
  const auto asleep_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (peer.control().sleepers.load() == 0 &&
         std::chrono::steady_clock::now() < asleep_deadline) {
    ::usleep(1000);
  }
  const bool asleep = peer.control().sleepers.load() != 0;
  ::kill(pid, SIGSTOP);
  ::usleep(3'000'000);
  ::kill(pid, SIGCONT);
  ::usleep(200'000);
  publish(peer, peer.slot(1).ring_sent.value, 1);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(asleep) << "the child never slept on the futex";
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: timed out after being continued";
}

TEST(WaitTest, ADeadPeerIsNamedWellBeforeTheTimeout) {
  const std::string id = job_id();
  OwnedSegment owned(id, 2, kStaging);
  Segment segment = Segment::attach(owned.name(), 0, 2, id);
  const pid_t pid = ::fork();
  if (pid == 0) {
    Segment peer = Segment::attach(owned.name(), 1, 2, id);
    ::pause();  // killed by the parent
    ::_exit(0);
  }
  // Until the child checked in (bounded: a child that never does fails the test, not hangs it).
  const auto check_in_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (segment.slot(1).pid.load() != pid &&
         std::chrono::steady_clock::now() < check_in_deadline) {
    ::usleep(1000);
  }
  if (segment.slot(1).pid.load() != pid) ::kill(pid, SIGKILL);
  ASSERT_EQ(segment.slot(1).pid.load(), pid) << "child did not check in within 10 s";
  ::kill(pid, SIGKILL);  // left unreaped on purpose: a zombie must count as gone
  Waiter waiter(segment, 30'000);
  const auto start = std::chrono::steady_clock::now();
  try {
    waiter.wait("test_op", [&] { return ordinal_one_sent(segment); });
    FAIL() << "no error";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("ordinal 1 (pid {}) is gone", pid)),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  ::waitpid(pid, nullptr, 0);
}

TEST(WaitTest, AZombieIsNotAlive) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  // Until reaped the child is a zombie; poll (bounded) until /proc shows it exited.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (process_alive(pid) && std::chrono::steady_clock::now() < deadline) ::usleep(1000);
  EXPECT_FALSE(process_alive(pid));
  EXPECT_TRUE(process_alive(::getpid()));
  ::waitpid(pid, nullptr, 0);
}

}  // namespace
}  // namespace xs
