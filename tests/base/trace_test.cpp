// The timeline's recorder and merge (base/trace.h) in one process: spans nest per thread, the
// part is written at flush, the merge names tracks, drops torn and foreign lines, and keeps
// recording bounded. The whole path through xla-spawn is in tests/launcher/trace_test.cpp.
#include "xla_spawn/base/trace.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "tests/support/scoped_env.h"

namespace xs {
namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

constexpr const char* kJob = "xs-1-0123abcd";

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("xs-trace-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    file_ = (dir_ / "job.json").string();
  }
  void TearDown() override {
    trace::stop();
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
  std::string file_;
};

TEST_F(TraceTest, OffByDefaultRecordsNothing) {
  ASSERT_FALSE(trace_on.load());
  {
    TraceScope span("never");
    EXPECT_FALSE(span.active());
  }
  EXPECT_EQ(trace::merge(file_, kJob, -1, true), 0u);
  EXPECT_EQ(count(read(file_), "\"ph\":\"X\""), 0u);
}

TEST_F(TraceTest, SpansNestPerThreadAndTheMergeNamesTheTrack) {
  trace::start(file_, kJob, 3, 0, trace::now_ns());
  {
    TraceScope outer("mark_step", "step");
    outer.arg("graph", 0x3fa2c1d09e8b7a6f, /*hex=*/true);
    TraceScope inner(std::string("a \"quoted\" name"));
    inner.arg("bytes", 4096);
    inner.arg("schedule", "direct");
  }
  std::thread([] { TraceScope span("loader", "data"); }).join();
  trace::stop();
  EXPECT_EQ(trace::merge(file_, kJob, -1, /*remove_parts=*/true), 3u);
  const std::string json = read(file_);
  EXPECT_TRUE(json.starts_with("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n")) << json;
  EXPECT_TRUE(json.ends_with("\n]}\n")) << json;
  EXPECT_NE(json.find("\"args\":{\"name\":\"ordinal 3\"}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"name\":\"mark_step\",\"cat\":\"step\",\"ph\":\"X\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"args\":{\"graph\":\"3fa2c1d09e8b7a6f\"}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"name\":\"a \\\"quoted\\\" name\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"args\":{\"bytes\":4096,\"schedule\":\"direct\"}"), std::string::npos) << json;
  // The thread that started tracing is "main" (tid 0); the other got a track of its own.
  EXPECT_NE(json.find("\"tid\":0,\"args\":{\"name\":\"main\"}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"name\":\"loader\",\"cat\":\"data\",\"ph\":\"X\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"tid\":1,\"args\":{\"name\":\"thread 1\"}"), std::string::npos) << json;
  EXPECT_FALSE(std::filesystem::exists(trace::part_path(file_, kJob, 0, 3)));
}

TEST_F(TraceTest, TheMergeDropsATornLastLineAndLinesOfAnotherTrack) {
  trace::start(file_, kJob, 0, 0, trace::now_ns());
  { TraceScope span("whole"); }
  trace::stop();
  {
    std::ofstream part(trace::part_path(file_, kJob, 0, 0), std::ios::app);
    part << "{\"name\":\"forged\",\"cat\":\"user\",\"ph\":\"X\",\"ts\":1,\"dur\":1,\"pid\":7,\"tid\":0}\n";
    part << "{\"name\":\"torn\",\"cat\":\"user\",\"ph\":\"X\",\"ts\":1,\"du";  // killed mid-write
  }
  EXPECT_EQ(trace::merge(file_, kJob, 2, true), 1u);
  const std::string json = read(file_);
  EXPECT_NE(json.find("\"name\":\"whole\""), std::string::npos) << json;
  EXPECT_EQ(json.find("forged"), std::string::npos) << json;
  EXPECT_EQ(json.find("torn"), std::string::npos) << json;
  EXPECT_NE(json.find("\"args\":{\"name\":\"node 2, ordinal 0\"}"), std::string::npos) << json;
}

TEST_F(TraceTest, AttemptsGetTracksOfTheirOwn) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    trace::start(file_, kJob, 1, attempt, trace::now_ns());
    { TraceScope span("step"); }
    trace::stop();
  }
  EXPECT_EQ(trace::merge(file_, kJob, -1, true), 2u);
  const std::string json = read(file_);
  EXPECT_NE(json.find("\"name\":\"ordinal 1 (attempt 0)\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"name\":\"ordinal 1 (attempt 1)\""), std::string::npos) << json;
}

TEST_F(TraceTest, RecordingStopsAtTheSpanLimitAndSaysSo) {
  testing::ScopedEnv limit("XLA_SPAWN_TRACE_MAX_SPANS", "5");
  trace::start(file_, kJob, 0, 0, trace::now_ns());
  for (int i = 0; i < 50; ++i) TraceScope span("step");
  trace::stop();
  EXPECT_EQ(trace::merge(file_, kJob, -1, true), 6u);  // the five, and the marker
  const std::string json = read(file_);
  EXPECT_EQ(count(json, "\"name\":\"step\""), 5u) << json;
  EXPECT_NE(json.find("trace truncated (XLA_SPAWN_TRACE_MAX_SPANS)"), std::string::npos) << json;
}

TEST_F(TraceTest, APartPlantedAsASymlinkIsReplacedNotFollowed) {
  const std::string victim = (dir_ / "victim").string();
  { std::ofstream(victim) << "keep"; }
  std::filesystem::create_symlink(victim, trace::part_path(file_, kJob, 0, 0));
  trace::start(file_, kJob, 0, 0, trace::now_ns());
  { TraceScope span("step"); }
  trace::stop();
  EXPECT_EQ(read(victim), "keep");
  struct stat st {};
  ASSERT_EQ(::lstat(trace::part_path(file_, kJob, 0, 0).c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// Spans are written every trace::kFlushIntervalMs by a thread of their own: a replica that
// records nothing more (asleep, stuck) and is then SIGKILLed keeps what it had recorded.
TEST_F(TraceTest, AReplicaKilledWhileStuckKeepsTheSpansItRecorded) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    trace::start(file_, kJob, 0, 0, trace::now_ns());
    { TraceScope a("before the hang"); }
    // Stuck until the flusher thread has written the span (bounded), then killed.
    const std::string part = trace::part_path(file_, kJob, 0, 0);
    for (int i = 0; i < 1000 && read(part).find("before the hang") == std::string::npos; ++i) {
      ::usleep(10'000);
    }
    ::kill(::getpid(), SIGKILL);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(trace::merge(file_, kJob, -1, true), 1u);
  EXPECT_NE(read(file_).find("\"name\":\"before the hang\""), std::string::npos) << read(file_);
}

// A child forked without exec neither writes the parent's buffered spans again nor its own.
TEST_F(TraceTest, AForkedChildWritesNothingToTheParentsPart) {
  trace::start(file_, kJob, 0, 0, trace::now_ns());
  { TraceScope a("parent's"); }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    { TraceScope c("child's"); }
    std::exit(0);  // runs the exit hook
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  trace::stop();
  EXPECT_EQ(trace::merge(file_, kJob, -1, true), 1u);
  EXPECT_EQ(count(read(file_), "parent's"), 1u);
  EXPECT_EQ(read(file_).find("child's"), std::string::npos);
}

// In a forked child: one span written, then a disk full (RLIMIT_FSIZE) for the 20 big spans
// recorded next, which the next flush cannot write.
void record_past_a_full_disk(const std::string& file) {
  ::signal(SIGXFSZ, SIG_IGN);
  trace::start(file, kJob, 0, 0, trace::now_ns());
  { TraceScope a("small"); }
  trace::flush();
  const rlimit limit{400, 400};
  ::setrlimit(RLIMIT_FSIZE, &limit);
  for (int i = 0; i < 20; ++i) TraceScope big(std::string(300, 'x'));
}

// A full disk (here: RLIMIT_FSIZE) cuts the part back to its last whole line, and the next
// write that fits says how many spans were lost; the merge then still gives valid lines.
TEST_F(TraceTest, AFailedWriteLeavesNoTornLineAndSaysWhatWasLost) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    record_past_a_full_disk(file_);
    trace::flush();  // fails: past the limit
    const rlimit lifted{RLIM_INFINITY, RLIM_INFINITY};
    ::setrlimit(RLIMIT_FSIZE, &lifted);
    { TraceScope b("after"); }
    trace::flush();
    std::_Exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  const std::string part = read(trace::part_path(file_, kJob, 0, 0));
  EXPECT_TRUE(part.ends_with("}\n")) << part;
  EXPECT_EQ(part.find("xxx"), std::string::npos) << "a torn line of the failed write";
  EXPECT_NE(part.find("20 span(s) lost (a write to the part failed)"), std::string::npos) << part;
  EXPECT_EQ(trace::merge(file_, kJob, -1, true), 3u);  // small, the marker, after
}

// A disk that stays full to the end: no later write carries the count into the part, so the
// replica says at exit how many spans were lost.
TEST_F(TraceTest, SpansLostToTheLastWritesAreReportedAtExit) {
  int err[2];
  ASSERT_EQ(::pipe(err), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::dup2(err[1], 2);
    record_past_a_full_disk(file_);
    std::exit(0);  // the exit hook's flush fails too
  }
  ::close(err[1]);
  std::string said;
  char buffer[4096];
  for (ssize_t n; (n = ::read(err[0], buffer, sizeof buffer)) > 0;) said.append(buffer, static_cast<size_t>(n));
  ::close(err[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_NE(said.find("20 span(s) of the timeline lost: the writes to " +
                      trace::part_path(file_, kJob, 0, 0) + " failed"),
            std::string::npos)
      << said;
}

// The launcher's clock origin can only be in the past: one in the future (a stray value)
// would put every span at a negative time; the replica runs untraced instead.
TEST_F(TraceTest, AClockOriginInTheFutureLeavesTheReplicaUntraced) {
  testing::ScopedEnv file(trace::kFileEnv, file_);
  testing::ScopedEnv t0(trace::kT0Env, "9223372036854775807");
  testing::ScopedEnv job("XLA_SPAWN_JOB_ID", kJob);
  trace::start_from_env(0, 0);
  EXPECT_FALSE(trace_on.load());
  EXPECT_FALSE(std::filesystem::exists(trace::part_path(file_, kJob, 0, 0)));
}

TEST_F(TraceTest, TheMergeRefusesToReplaceWhatIsNotARegularFileAndKeepsTheParts) {
  trace::start(file_, kJob, 0, 0, trace::now_ns());
  { TraceScope a("kept"); }
  trace::stop();
  std::filesystem::create_directory(file_);
  EXPECT_THROW(trace::merge(file_, kJob, -1, true), IoError);
  EXPECT_TRUE(std::filesystem::is_directory(file_));
  EXPECT_TRUE(std::filesystem::exists(trace::part_path(file_, kJob, 0, 0)));
}

// Another job's parts next to the same file (a concurrent job, a killed launcher's leftovers,
// a planted file) are neither merged nor removed.
TEST_F(TraceTest, TheMergeTakesOnlyItsOwnJobsParts) {
  trace::start(file_, kJob, 0, 0, trace::now_ns());
  { TraceScope a("mine"); }
  trace::stop();
  const std::string other = trace::part_path(file_, "xs-2-99999999", 0, 1);
  {
    std::ofstream(other) << "{\"name\":\"theirs\",\"cat\":\"user\",\"ph\":\"X\",\"ts\":1,"
                            "\"dur\":1,\"pid\":1,\"tid\":0}\n";
  }
  EXPECT_EQ(trace::merge(file_, kJob, -1, true), 1u);
  EXPECT_EQ(read(file_).find("theirs"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(other));
}

TEST_F(TraceTest, NamesThatAreNotUtf8BecomeReplacementCharacters) {
  trace::start(file_, kJob, 0, 0, trace::now_ns());
  { TraceScope a(std::string("caf\xc3\xa9 \xff\xfe end")); }
  trace::stop();
  trace::merge(file_, kJob, -1, true);
  EXPECT_NE(read(file_).find("caf\xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd end"), std::string::npos) << read(file_);
}

}  // namespace
}  // namespace xs
