#include "xla_spawn/shm/call_report.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "xla_spawn/shm/futex.h"
#include "xla_spawn/shm/segment.h"
#include "xla_spawn/shm/stack_dump.h"

// Calls generated code (a page of its own, no unwind tables); exported, so the dump can name it.
volatile int xs_test_returned_from_generated_code = 0;
extern "C" __attribute__((noinline)) void xs_test_enter_generated_code(void (*code)()) {
  code();
  xs_test_returned_from_generated_code = 1;  // no tail call: the return address stays on the stack
}

namespace xs {
namespace {

OrdinalCall call(int ordinal, char state, uint64_t seq, double waiting, int awaited) {
  OrdinalCall c;
  c.ordinal = ordinal;
  c.pid = 100 + ordinal;
  c.state = state;
  c.seq = seq;
  c.name = "all_reduce";
  c.dtype = "f32";
  c.n_elems = 669706;
  c.graph_hash = 0x3fa2c1d09e8b7a6f;
  c.seconds_in_call = 61.25;
  c.seconds_waiting = waiting;
  c.awaited = awaited;
  return c;
}

TEST(CallReport, NamesWhoWaitsForWhomAndWhoHoldsThemUp) {
  const std::string report = format_calls(
      {call(0, 'S', 1205, 60.04, 1), call(1, 'T', 1204, -1, -1), call(2, 'S', 1205, 59.9, 1)}, 4);
  EXPECT_EQ(report,
            "  ordinal 4 (pid 100, sleeping): all_reduce #1205 (f32, 669706 elements, graph "
            "3fa2c1d09e8b7a6f) for 61.2 s, waiting 60.0 s for ordinal 5\n"
            "  ordinal 5 (pid 101, stopped): all_reduce #1204 (f32, 669706 elements, graph "
            "3fa2c1d09e8b7a6f) for 61.2 s, not waiting\n"
            "  ordinal 6 (pid 102, sleeping): all_reduce #1205 (f32, 669706 elements, graph "
            "3fa2c1d09e8b7a6f) for 61.2 s, waiting 59.9 s for ordinal 5\n"
            "  held up by ordinal(s) 5 (stopped)\n");
}

TEST(CallReport, AnOrdinalWithoutCallsAndOneThatIsGone) {
  OrdinalCall none;
  none.ordinal = 1;
  none.pid = 7;
  none.state = 'R';
  const std::string report = format_calls({call(0, '\0', 3, 5.0, 1), none}, 0);
  EXPECT_NE(report.find("ordinal 0 (pid 100, gone): all_reduce #3"), std::string::npos) << report;
  EXPECT_NE(report.find("ordinal 1 (pid 7, running): no collective call yet\n"), std::string::npos)
      << report;
  EXPECT_NE(report.find("held up by ordinal(s) 1 (running)"), std::string::npos) << report;
}

// Ordinal 1 has returned from call #1204 and computes: it is not in the call, and it holds up
// the others waiting for it in #1205. A returned ordinal's own record blames nobody.
TEST(CallReport, AnOrdinalBetweenCallsIsNotShownInsideItsLatest) {
  OrdinalCall between = call(1, 'R', 1204, -1, -1);
  between.returned = true;
  between.seconds_in_call = 1.93;
  OrdinalCall stale = call(2, 'R', 1205, 3.0, 0);  // a wait that ended with the call
  stale.returned = true;
  const std::string report = format_calls({call(0, 'S', 1205, 1.5, 1), between, stale}, 0);
  EXPECT_NE(report.find("  ordinal 1 (pid 101, running): between collective calls, the latest "
                        "all_reduce #1204 (f32, 669706 elements, graph 3fa2c1d09e8b7a6f) began "
                        "1.9 s ago\n"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("waiting 3.0 s"), std::string::npos) << report;
  EXPECT_NE(report.find("  held up by ordinal(s) 1 (running)\n"), std::string::npos) << report;
}

// A multi-node job whose node 1 is late: ordinals 0 and 1 (node 0) have finished the call's
// local phase and wait in its network phase, which the report names as such, blaming nobody
// on this node; before any shared-memory call (a 1-replica phase first) it is still shown.
TEST(CallReport, AnOrdinalBetweenNodesIsShownWaitingForTheOtherNodes) {
  OrdinalCall network = call(0, 'S', 57, 12.25, -1);
  network.returned = true;  // its last shared-memory call (the local reduce) had returned
  network.between_nodes = true;
  network.seconds_in_call = 12.3;
  OrdinalCall first = call(1, 'S', 0, 2.0, -1);
  first.name = "barrier";
  first.dtype = "";
  first.n_elems = 0;
  first.graph_hash = 0;
  first.between_nodes = true;
  first.seconds_in_call = 2.04;
  const std::string report = format_calls({network, first}, 0);
  EXPECT_EQ(report,
            "  ordinal 0 (pid 100, sleeping): all_reduce (f32, 669706 elements, graph "
            "3fa2c1d09e8b7a6f) between nodes for 12.3 s, waiting for the other nodes\n"
            "  ordinal 1 (pid 101, sleeping): barrier between nodes for 2.0 s, "
            "waiting for the other nodes\n");
}

// Ordinal 1 was stopped inside its wait for ordinal 0; ordinal 0 then arrived, waited for 1
// and died of the timeout. Only the stopped one holds the job up: its wait is stale.
TEST(CallReport, AWaitOfAStoppedOrdinalBlamesNobody) {
  const std::string report =
      format_calls({call(0, '\0', 20, 5.1, 1), call(1, 'T', 20, 5.1, 0)}, 0);
  EXPECT_NE(report.find("  held up by ordinal(s) 1 (stopped)\n"), std::string::npos) << report;
}

// The records come from a real segment's slots; garbage in one (a scribbling replica) is
// range-checked, never trusted as a name, dtype or ordinal.
TEST(CallReport, ReadsTheSlotsOfASegmentAndDistrustsGarbage) {
  const std::string id = "callreport" + std::to_string(::getpid());
  OwnedSegment owned(id, 2, 64 << 10);
  Segment segment = Segment::attach(owned.name(), 0, 2, id);
  shm::CallRecord& good = segment.slot(0).call;
  std::memcpy(good.name, "barrier", 8);
  good.seq = 9;
  good.started_ns = 1;  // long ago
  shm::CallRecord& bad = segment.slot(1).call;
  std::memset(bad.name, '\xff', sizeof bad.name);
  bad.seq = 4;
  bad.dtype = 77;
  bad.awaited = 1000;
  bad.waiting_since_ns = INT64_MAX;
  const std::vector<OrdinalCall> calls =
      read_calls(&segment.control(),
                 shm::segment_bytes(2, segment.staging_bytes(), segment.arena_bytes()), 2, {});
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].pid, ::getpid());
  EXPECT_EQ(calls[0].state, 'R');
  EXPECT_EQ(calls[0].name, "barrier");
  EXPECT_EQ(calls[0].seq, 9u);
  EXPECT_GT(calls[0].seconds_in_call, 0);
  EXPECT_EQ(calls[1].name, "?");
  EXPECT_EQ(calls[1].dtype, "");
  EXPECT_EQ(calls[1].awaited, -1);
  EXPECT_LT(calls[1].seconds_waiting, 0);
}

// An ordinal's arrival counts: of `calls`, `waited` waited for a late arrival, and it was the
// late one at `last` of those, `late_us` after the first in all.
// In training steps unless `steps` is false.
OrdinalCall arrivals(int ordinal, uint64_t waited, uint64_t last, uint64_t late_us,
                     bool steps = true) {
  OrdinalCall c = call(ordinal, 'S', 500, -1, -1);
  (steps ? c.steps : c.other) = {500, waited, last, late_us};
  return c;
}

TEST(StragglerLine, NamesAnOrdinalLastAtMoreThanHalfTheCallsThatWaited) {
  const auto line = straggler_line(
      {arrivals(0, 100, 20, 2'000), arrivals(1, 100, 25, 2'500), arrivals(2, 100, 55, 44'000)}, 4);
  ASSERT_TRUE(line.has_value());
  EXPECT_TRUE(line->starts_with("ordinal 6 arrived last at 55% of the 100 training steps that "
                                "waited (of 500), 0.80 ms after the first on average"))
      << *line;
}

TEST(StragglerLine, ChanceAloneNamesNobody) {
  // 13 of 25 at N = 3 is over half, but chance alone gives it 4% of the time.
  EXPECT_NEAR(binomial_tail(25, 13, 1.0 / 3), 0.0415, 0.001);
  EXPECT_FALSE(straggler_line({arrivals(0, 25, 6, 600), arrivals(1, 25, 6, 600),
                               arrivals(2, 25, 13, 13'000)}, 0));
  // 40 of 60 is not chance (p < 1e-6).
  EXPECT_TRUE(straggler_line({arrivals(0, 60, 10, 600), arrivals(1, 60, 10, 600),
                              arrivals(2, 60, 40, 40'000)}, 0));
  EXPECT_DOUBLE_EQ(binomial_tail(10, 0, 0.5), 1.0);
  EXPECT_NEAR(binomial_tail(10, 10, 0.5), 1.0 / 1024, 1e-12);
}

TEST(StragglerLine, LateByLittleAgainstItsStepsNamesNobody) {
  std::vector<OrdinalCall> calls = {arrivals(0, 200, 10, 1'000), arrivals(1, 200, 190, 57'000)};
  for (OrdinalCall& c : calls) c.step_ms = 10;  // 0.3 ms late in 10 ms steps: 3 %
  EXPECT_FALSE(straggler_line(calls, 0));
  for (OrdinalCall& c : calls) c.step_ms = 2;  // in 2 ms steps: 15 %
  const auto line = straggler_line(calls, 0);
  ASSERT_TRUE(line.has_value());
  EXPECT_NE(line->find("0.30 ms after the first on average, in steps of 2.00 ms: "), std::string::npos)
      << *line;
}

// Between nodes a replica's exchange with the other nodes makes it late too (a lossy link
// did, in an outside probe, and the line blamed only the replica's own host).
TEST(StragglerLine, AMultiNodeJobsLineNamesTheLinkToTheOtherNodes) {
  const std::vector<OrdinalCall> calls = {arrivals(0, 300, 60, 6'000), arrivals(1, 300, 240, 192'000)};
  const auto one_node = straggler_line(calls, 0);
  const auto spanning = straggler_line(calls, 4, true);
  ASSERT_TRUE(one_node.has_value() && spanning.has_value());
  EXPECT_TRUE(one_node->ends_with("its data loading, a larger shard)")) << *one_node;
  EXPECT_TRUE(spanning->starts_with("ordinal 5 arrived last")) << *spanning;
  EXPECT_TRUE(spanning->ends_with("a larger shard, its link to the other nodes)")) << *spanning;
  EXPECT_NE(format_calls(calls, 4, true).find("its link to the other nodes"), std::string::npos);
}

TEST(StragglerLine, TrainingStepsDecideWhenThereAreEnoughOfThem) {
  // Ordinal 0 is last at the checkpoint's calls, ordinal 2 at the steps: the steps decide.
  std::vector<OrdinalCall> calls = {arrivals(0, 100, 10, 1'000), arrivals(1, 100, 10, 1'000),
                                    arrivals(2, 100, 80, 80'000)};
  calls[0].other = {300, 300, 280, 560'000};
  calls[1].other = calls[2].other = {300, 300, 10, 1'000};
  auto line = straggler_line(calls, 0);
  ASSERT_TRUE(line.has_value());
  EXPECT_TRUE(line->starts_with("ordinal 2 arrived last at 80% of the 100 training steps")) << *line;
  // Without steps (no runtime programs), every call counts.
  for (OrdinalCall& c : calls) c.steps = {};
  line = straggler_line(calls, 0);
  ASSERT_TRUE(line.has_value());
  EXPECT_TRUE(line->starts_with("ordinal 0 arrived last at 93% of the 300 collective calls that "
                                "waited (of 300), 2.00 ms"))
      << *line;
}

TEST(StragglerLine, StaysQuietWhenChanceExplainsIt) {
  // Half of the calls at N = 3, or two thirds at N = 2 (chance alone gives a half there).
  EXPECT_FALSE(straggler_line({arrivals(0, 100, 25, 0), arrivals(1, 100, 25, 0),
                               arrivals(2, 100, 50, 40'000)}, 0));
  EXPECT_FALSE(straggler_line({arrivals(0, 300, 100, 80'000), arrivals(1, 300, 200, 160'000)}, 0));
  EXPECT_TRUE(straggler_line({arrivals(0, 300, 60, 6'000), arrivals(1, 300, 240, 192'000)}, 0));
  // Too few calls waited for anyone.
  EXPECT_FALSE(straggler_line({arrivals(0, 19, 0, 0), arrivals(1, 19, 0, 0), arrivals(2, 19, 19, 19'000)}, 0));
  // One replica has nobody to be late for.
  EXPECT_FALSE(straggler_line({arrivals(0, 100, 100, 100'000)}, 0));
}

TEST(StragglerLine, TheHangReportShowsEveryOrdinalsArrivals) {
  const std::string report =
      format_calls({arrivals(0, 200, 20, 4'000), arrivals(1, 200, 180, 900'000)}, 0);
  EXPECT_NE(report.find("; 500 calls, 200 waited, last to arrive at 20, 0.20 ms late on average\n"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("  ordinal 1 arrived last at 90% of the 200 training steps"),
            std::string::npos)
      << report;
}

// What backtrace_symbols() gives, as the dump shows it.
TEST(StackDump, FramesAreDemangledWithTheirModule) {
  EXPECT_EQ(describe_frame("/x/build/train_fmnist(_ZN2xs6Waiter9wait_slowEPKc+0x1f3) [0x55d0c0ffee00]"),
            "  at xs::Waiter::wait_slow(char const*) (train_fmnist+0x1f3)");
  EXPECT_EQ(describe_frame("/lib/x86_64-linux-gnu/libc.so.6(+0x8a1b2) [0x7f00]"),
            "  at ?? (libc.so.6+0x8a1b2)");
  EXPECT_EQ(describe_frame("./a(main+0x8c) [0x1]"), "  at main (a+0x8c)");
  EXPECT_EQ(describe_frame("[0x7f00]"), "  at ?? [0x7f00]");
  EXPECT_EQ(stack_header_frames("xla-spawn: stack of pid 42, 19 frames:"), 19);
  EXPECT_EQ(stack_header_frames("xla-spawn: stack of pid 42, x frames:"), std::nullopt);
  EXPECT_EQ(stack_header_frames("xla-spawn: stack of pid 42, 99999999999 frames:"), std::nullopt);
  EXPECT_EQ(stack_header_frames("something else"), std::nullopt);
}

// Forks a process that writes its stderr to the returned pipe, attaches to `owned` as ordinal
// 0 and runs `body`, then exits 0. Returns the pid; `err_fd` is the pipe's read end.
pid_t fork_attached(const OwnedSegment& owned, const std::string& id, int& err_fd,
                    const std::function<void(Segment&)>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::dup2(fds[1], 2);
    ::close(fds[1]);
    Segment segment = Segment::attach(owned.name(), 0, 1, id);
    body(segment);
    ::_exit(0);
  }
  ::close(fds[1]);
  err_fd = fds[0];
  return pid;
}

// A process that attached handles the signal: its stack arrives on stderr, demangled, every
// frame the header announces, and it goes on (the unwinding happens in a throwaway copy).
TEST(StackDump, AnAttachedProcessPrintsItsStackAndGoesOn) {
  const std::string id = "stackdump" + std::to_string(::getpid());
  OwnedSegment owned(id, 1, 64 << 10);
  int err_fd = -1;
  const pid_t pid = fork_attached(owned, id, err_fd, [](Segment& segment) {
    if (segment.slot(0).call.dumps_stack.load() != 1) ::_exit(3);
    ::raise(stack_dump_signal());
  });
  ASSERT_GT(pid, 0);
  std::string err;
  char buffer[4096];
  // EOF once the replica and the dumping grandchild (which holds stderr too) are done.
  for (ssize_t n; (n = ::read(err_fd, buffer, sizeof buffer)) > 0;) {
    err.append(buffer, static_cast<size_t>(n));
  }
  ::close(err_fd);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: the handler was not installed";
  const size_t header = err.find("xla-spawn: stack of pid " + std::to_string(pid) + ", ");
  ASSERT_NE(header, std::string::npos) << err;
  const std::optional<int> frames =
      stack_header_frames(err.substr(header, err.find('\n', header) - header));
  ASSERT_TRUE(frames.has_value()) << err;
  size_t lines = 0;
  for (size_t at = err.find("\n  at "); at != std::string::npos; at = err.find("\n  at ", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, static_cast<size_t>(*frames)) << err;
  EXPECT_GT(lines, 2u) << err;
}

// The stack dump of a child that attached and then runs `code` (copied to a page of its own,
// no unwind tables; it must spin for ever) called from xs_test_enter_generated_code, with
// `scratch` the address of another writable page, patched in at `scratch_at` bytes into
// `code` unless that is negative. Returns what the child wrote to stderr, up to the dump's
// last scanned frame (or 10 s), and its pid.
struct ChildDump {
  pid_t pid = -1;
  std::string err;
};
ChildDump dump_of_generated_code(const std::string& id, std::vector<unsigned char> code,
                                   int scratch_at) {
  OwnedSegment owned(id, 1, 64 << 10);
  // Set by the child (attached, its handler installed) just before it enters the code.
  void* shared = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return {-1, "mmap failed"};
  auto* entering = static_cast<std::atomic<int>*>(shared);
  int err_fd = -1;
  const pid_t pid = fork_attached(owned, id, err_fd, [&](Segment&) {
    ::alarm(20);
    void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void* scratch = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                           -1, 0);
    if (page == MAP_FAILED || scratch == MAP_FAILED) ::_exit(4);
    if (scratch_at >= 0) {
      const auto top = reinterpret_cast<uintptr_t>(scratch) + 4096 - 64;
      std::memcpy(code.data() + scratch_at, &top, sizeof top);
    }
    std::memcpy(page, code.data(), code.size());
    entering->store(1);
    xs_test_enter_generated_code(reinterpret_cast<void (*)()>(page));
  });
  if (pid <= 0) return {pid, "fork failed"};
  // Into the loop: the child said it enters the code, and has since used CPU time (nothing
  // else runs there after it). A fixed pause met a child not yet attached on a loaded machine.
  const auto user_ticks = [pid]() -> long {
    std::istringstream fields(process_stat_fields(pid).value_or(""));
    std::string field;
    for (int k = 0; k <= 11 && fields >> field; ++k) {  // utime: field 14 of stat, 12th here
      if (k == 11) return std::stol(field);
    }
    return -1;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (entering->load() == 0 && std::chrono::steady_clock::now() < deadline) ::usleep(1000);
  const long entered_at = user_ticks();
  while (user_ticks() <= entered_at && std::chrono::steady_clock::now() < deadline) ::usleep(1000);
  const bool in_loop = entering->load() != 0 && entered_at >= 0 && user_ticks() > entered_at;
  ::munmap(shared, 4096);
  if (!in_loop) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    ::close(err_fd);
    return {pid, "the child never entered the generated code"};
  }
  if (::kill(pid, stack_dump_signal()) != 0) return {pid, "kill failed"};
  std::string err;
  char buffer[4096];
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  // Until the dump's last line (the scanned frames end it) or 10 s.
  while (err.empty() || err.back() != '\n' || err.find("[scanned]") == std::string::npos) {
    if (std::chrono::steady_clock::now() > until) break;
    pollfd p{err_fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::read(err_fd, buffer, sizeof buffer);
    if (n <= 0) break;
    err.append(buffer, static_cast<size_t>(n));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ::usleep(200 * 1000);  // the dumping grandchild has written by now
  for (ssize_t n; (n = ::read(err_fd, buffer, sizeof buffer)) > 0;) {
    err.append(buffer, static_cast<size_t>(n));
  }
  ::close(err_fd);
  return {pid, err};
}

// What a scanned dump must show: the header, the caller of the generated code, and main (the
// one of gtest_main), each found on the thread's own stack.
void expect_scanned_to_main(const ChildDump& dump) {
  const std::string& err = dump.err;
  EXPECT_NE(err.find("xla-spawn: stack of pid " + std::to_string(dump.pid) + ", "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("  at xs_test_enter_generated_code (shm_test+"), std::string::npos) << err;
  EXPECT_NE(err.find("  at main ("), std::string::npos) << err;
  EXPECT_NE(err.find("[scanned]"), std::string::npos) << err;
}

// The unwinder stops in code no module holds, as in oneDNN's generated GEMM kernels or the
// runtime's JIT loops: the frames above it are found by scanning the interrupted stack.
TEST(StackDump, FramesAboveGeneratedCodeAreScannedFromTheStack) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer runs a signal's handler only when the thread next enters "
                  "an intercepted call, and this one spins in generated code that never does";
#endif
  expect_scanned_to_main(dump_of_generated_code("stackscan" + std::to_string(::getpid()),
                                                {0xEB, 0xFE},  // jmp . (for ever, until killed)
                                                -1));
}

// Generated code that runs with its stack pointer off the thread's stack, as oneDNN's sgemm
// kernel does with a heap workspace for long rows, keeping the old one at its new stack's
// bottom: the scan enters the thread's stack there (it used to scan the workspace alone and
// show one '??' frame: the flake of FaultTest.StoppedReplicaTimesOutItsPeersAndIsNamed).
TEST(StackDump, GeneratedCodeOnAStackOfItsOwnIsScannedOnTheThreadsStack) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer runs a signal's handler only when the thread next enters "
                  "an intercepted call, and this one spins in generated code that never does";
#endif
  expect_scanned_to_main(dump_of_generated_code(
      "stackown" + std::to_string(::getpid()),
      {0x48, 0x89, 0xE0,                    // mov %rsp, %rax
       0x48, 0xBC, 0, 0, 0, 0, 0, 0, 0, 0,  // movabs $scratch, %rsp
       0x50,                                // push %rax (the old stack pointer)
       0xEB, 0xFE},                         // jmp .
      5));
}

// The same with the old stack pointer kept nowhere (no register points into the thread's
// stack either): the whole of the thread's stack is scanned.
TEST(StackDump, GeneratedCodeThatKeptNoStackPointerIsScannedOnTheWholeStack) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer runs a signal's handler only when the thread next enters "
                  "an intercepted call, and this one spins in generated code that never does";
#endif
  expect_scanned_to_main(dump_of_generated_code(
      "stacknone" + std::to_string(::getpid()),
      {0x48, 0xBC, 0, 0, 0, 0, 0, 0, 0, 0,  // movabs $scratch, %rsp
       0x31, 0xC0, 0x31, 0xDB, 0x31, 0xC9, 0x31, 0xD2,  // xor of rax, rbx, rcx, rdx
       0x31, 0xF6, 0x31, 0xFF, 0x31, 0xED,              // ... rsi, rdi, rbp
       0x45, 0x31, 0xC0, 0x45, 0x31, 0xC9, 0x45, 0x31, 0xD2, 0x45, 0x31, 0xDB,  // ... r8-r11
       0x45, 0x31, 0xE4, 0x45, 0x31, 0xED, 0x45, 0x31, 0xF6, 0x45, 0x31, 0xFF,  // ... r12-r15
       0xEB, 0xFE},                                     // jmp .
      2));
}

}  // namespace
}  // namespace xs
