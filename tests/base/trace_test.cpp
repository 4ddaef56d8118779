// The timeline's recorder and merge (base/trace.h) in one process: spans nest per thread, the
// part is written at flush, the merge names tracks, drops torn and foreign lines, and keeps
// recording bounded. The whole path through xla-spawn is in tests/launcher/trace_test.cpp.
#include "xla_spawn/base/trace.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include <gtest/gtest.h>

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
  EXPECT_EQ(trace::merge(file_, -1, true), 0u);
  EXPECT_EQ(count(read(file_), "\"ph\":\"X\""), 0u);
}

TEST_F(TraceTest, SpansNestPerThreadAndTheMergeNamesTheTrack) {
  trace::start(file_, 3, 0, trace::now_ns());
  {
    TraceScope outer("mark_step", "step");
    outer.arg("graph", 0x3fa2c1d09e8b7a6f, /*hex=*/true);
    TraceScope inner(std::string("a \"quoted\" name"));
    inner.arg("bytes", 4096);
    inner.arg("schedule", "direct");
  }
  std::thread([] { TraceScope span("loader", "data"); }).join();
  trace::stop();
  EXPECT_EQ(trace::merge(file_, -1, /*remove_parts=*/true), 3u);
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
  EXPECT_FALSE(std::filesystem::exists(trace::part_path(file_, 0, 3)));
}

TEST_F(TraceTest, TheMergeDropsATornLastLineAndLinesOfAnotherTrack) {
  trace::start(file_, 0, 0, trace::now_ns());
  { TraceScope span("whole"); }
  trace::stop();
  {
    std::ofstream part(trace::part_path(file_, 0, 0), std::ios::app);
    part << "{\"name\":\"forged\",\"cat\":\"user\",\"ph\":\"X\",\"ts\":1,\"dur\":1,\"pid\":7,\"tid\":0}\n";
    part << "{\"name\":\"torn\",\"cat\":\"user\",\"ph\":\"X\",\"ts\":1,\"du";  // killed mid-write
  }
  EXPECT_EQ(trace::merge(file_, 2, true), 1u);
  const std::string json = read(file_);
  EXPECT_NE(json.find("\"name\":\"whole\""), std::string::npos) << json;
  EXPECT_EQ(json.find("forged"), std::string::npos) << json;
  EXPECT_EQ(json.find("torn"), std::string::npos) << json;
  EXPECT_NE(json.find("\"args\":{\"name\":\"node 2, ordinal 0\"}"), std::string::npos) << json;
}

TEST_F(TraceTest, AttemptsGetTracksOfTheirOwn) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    trace::start(file_, 1, attempt, trace::now_ns());
    { TraceScope span("step"); }
    trace::stop();
  }
  EXPECT_EQ(trace::merge(file_, -1, true), 2u);
  const std::string json = read(file_);
  EXPECT_NE(json.find("\"name\":\"ordinal 1 (attempt 0)\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"name\":\"ordinal 1 (attempt 1)\""), std::string::npos) << json;
}

TEST_F(TraceTest, RecordingStopsAtTheSpanLimitAndSaysSo) {
  testing::ScopedEnv limit("XLA_SPAWN_TRACE_MAX_SPANS", "5");
  trace::start(file_, 0, 0, trace::now_ns());
  for (int i = 0; i < 50; ++i) TraceScope span("step");
  trace::stop();
  EXPECT_EQ(trace::merge(file_, -1, true), 6u);  // the five, and the marker
  const std::string json = read(file_);
  EXPECT_EQ(count(json, "\"name\":\"step\""), 5u) << json;
  EXPECT_NE(json.find("trace truncated (XLA_SPAWN_TRACE_MAX_SPANS)"), std::string::npos) << json;
}

TEST_F(TraceTest, APartPlantedAsASymlinkIsReplacedNotFollowed) {
  const std::string victim = (dir_ / "victim").string();
  { std::ofstream(victim) << "keep"; }
  std::filesystem::create_symlink(victim, trace::part_path(file_, 0, 0));
  trace::start(file_, 0, 0, trace::now_ns());
  { TraceScope span("step"); }
  trace::stop();
  EXPECT_EQ(read(victim), "keep");
  struct stat st {};
  ASSERT_EQ(::lstat(trace::part_path(file_, 0, 0).c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

}  // namespace
}  // namespace xs
