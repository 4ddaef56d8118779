// The timeline end to end: `xla-spawn --trace FILE` over a real train_fmnist job at N = 4 gives
// one valid trace-event file with a track per ordinal whose spans nest
// (scripts/check-trace), and a bad --trace is refused before anything starts.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/launcher/launch_support.h"
#include "tests/reliability/job_probe.h"
#include "tests/support/deadline_scale.h"
#include "tests/support/scoped_env.h"

namespace xs::testing {
namespace {

// A shell command's exit status (-1 when it did not exit) and its output, stderr included.
std::pair<int, std::string> run_shell(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string out;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The checker's output and exit status (-1 when python3 cannot run it).
std::pair<int, std::string> check_trace(const std::string& args) {
  return run_shell(fmt::format("python3 {} {}", XS_CHECK_TRACE_SCRIPT, args));
}

bool has_python3() { return std::system("python3 -c pass >/dev/null 2>&1") == 0; }

TEST(TimelineTest, ATrainingJobAtFourReplicasGivesOneNestedTrackPerOrdinal) {
  if (!has_python3()) GTEST_SKIP() << "python3 is missing (scripts/check-trace needs it)";
  TempDir dir;
  const std::string file = dir.path() + "/train.json";
  const RunResult r = run_xla_spawn(
      {"-n", "4", "--trace", file, "--", train_fmnist_path(), "--model", "mlp", "--batch-size",
       "16", "--epochs", "1", "--max-steps", "12", "--train-samples", "4096", "--no-eval",
       "--seed", "7", "--checkpoint", dir.path() + "/model.ckpt", "--checkpoint-every", "6"},
      std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("xla-spawn: trace of "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" span(s) written to " + file), std::string::npos) << r.err;
  const auto [status, out] = check_trace(
      fmt::format("'{}' --ordinals 4 --require mark_step --require trace --require run --require compile "
                  "--require 'wait for peers' --require 'data wait' --require reduce_scatter "
                  "--require all_gather",
                  file));
  EXPECT_EQ(status, 0) << out;
  // The master writes the checkpoints, the others do not.
  const std::string writers = check_trace(fmt::format("'{}' --require 'checkpoint write'", file)).second;
  EXPECT_NE(writers.find("ordinal 1 has no 'checkpoint write' span"), std::string::npos) << writers;
  EXPECT_EQ(writers.find("ordinal 0 has no"), std::string::npos) << writers;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_FALSE(entry.path().string().ends_with(".part")) << entry.path() << " left behind";
  }
}

// A job that hangs and times out still leaves its timeline: the replica waiting in the
// collective writes its spans while it waits, the one asleep outside wrote them as it went.
TEST(TimelineTest, AJobThatTimesOutLeavesTheTimelineUpToTheHang) {
  if (!has_python3()) GTEST_SKIP() << "python3 is missing (scripts/check-trace needs it)";
  TempDir dir;
  const std::string file = dir.path() + "/hang.json";
  ScopedEnv fault("XLA_SPAWN_TEST_FAULT", "sleep@1:6");
  // Long enough for the replicas' start-up apart (the first collective waits it out).
  ScopedEnv timeout("XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", std::to_string(8000 * deadline_scale()));
  const RunResult r = run_xla_spawn(
      {"-n", "2", "--grace-period", "1", "--trace", file, "--", train_fmnist_path(), "--model",
       "mlp", "--batch-size", "16", "--epochs", "1", "--max-steps", "40", "--train-samples",
       "4096", "--no-eval"},
      std::chrono::seconds(120));
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("trace of "), std::string::npos) << r.err;
  const auto [status, out] =
      check_trace(fmt::format("'{}' --ordinals 2 --require mark_step --require reduce_scatter", file));
  EXPECT_EQ(status, 0) << out;
}

// scripts/plot-trace draws a few steps of a real trace as a PNG (the docs show one).
TEST(TimelineTest, PlotTraceDrawsAFewStepsOfATrainingJob) {
  if (!has_python3() || std::system("gnuplot --version >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 or gnuplot is missing (scripts/plot-trace needs both)";
  }
  TempDir dir;
  const std::string file = dir.path() + "/train.json", png = dir.path() + "/steps.png";
  const RunResult r = run_xla_spawn(
      {"-n", "2", "--trace", file, "--", train_fmnist_path(), "--model", "mlp", "--batch-size",
       "16", "--epochs", "1", "--max-steps", "10", "--train-samples", "4096", "--no-eval"},
      std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string command =
      fmt::format("python3 {} '{}' -o '{}' --from 3 --steps 3 2>&1", XS_PLOT_TRACE_SCRIPT, file, png);
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::FILE* f = std::fopen(png.c_str(), "rb");
  ASSERT_NE(f, nullptr) << png << " not written";
  unsigned char magic[8] = {};
  EXPECT_EQ(std::fread(magic, 1, sizeof magic, f), sizeof magic);
  std::fclose(f);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(magic), 8), "\x89PNG\r\n\x1a\n");
}

// A trace is data from anywhere: a track or file name must not run commands through gnuplot.
TEST(TimelineTest, PlotTraceRunsNothingThatATraceOrItsNameCarries) {
  if (!has_python3() || std::system("gnuplot --version >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 or gnuplot is missing (scripts/plot-trace needs both)";
  }
  TempDir dir;
  const std::string file = dir.path() + "/b`touch by_name`.json";  // run in dir, if run
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::string events = fmt::format(
        "{{\"traceEvents\":[{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,"
        "\"args\":{{\"name\":\"x\\\" 0); system \\\"touch {0}/by_track\\\"; set ytics (\\\"y`touch "
        "{0}/by_backquote`'\"}}}}",
        dir.path());
    for (int i = 0; i < 6; ++i) {
      events += fmt::format(",{{\"name\":\"mark_step\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":{},"
                            "\"dur\":5,\"pid\":0,\"tid\":0}}",
                            i * 10);
    }
    std::fputs((events + "]}").c_str(), f);
    std::fclose(f);
  }
  const std::string command =
      fmt::format("cd '{}' && python3 {} 'b`touch by_name`.json' -o plot.png --from 1 --steps 3 2>&1",
                  dir.path(), XS_PLOT_TRACE_SCRIPT);
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/plot.png"));
  for (const char* name : {"by_name", "by_track", "by_backquote"}) {
    EXPECT_FALSE(std::filesystem::exists(dir.path() + "/" + name)) << name << ": a command ran";
  }
}

TEST(TimelineTest, TheCheckerFailsOnSpansThatOverlapWithoutNesting) {
  if (!has_python3()) GTEST_SKIP() << "python3 is missing (scripts/check-trace needs it)";
  TempDir dir;
  const std::string file = dir.path() + "/bad.json";
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(
        "{\"traceEvents\":[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,"
        "\"args\":{\"name\":\"ordinal 0\"}},"
        "{\"name\":\"a\",\"ph\":\"X\",\"ts\":0,\"dur\":10,\"pid\":0,\"tid\":0},"
        "{\"name\":\"b\",\"ph\":\"X\",\"ts\":5,\"dur\":10,\"pid\":0,\"tid\":0}]}",
        f);
    std::fclose(f);
  }
  const auto [status, out] = check_trace("'" + file + "' --ordinals 1");
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("'b' [5, 15] overlaps 'a' [0, 10] without nesting"), std::string::npos) << out;
}

TEST(TimelineTest, ATraceFileInAMissingDirectoryIsRefusedBeforeAnythingStarts) {
  TempDir dir;
  const RunResult r = run_xla_spawn(
      {"-n", "2", "--trace", dir.path() + "/no/such/dir/t.json", "--", helper_path(), "--do",
       "exit:0"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--trace " + dir.path() + "/no/such/dir/t.json: directory " + dir.path() +
                       "/no/such/dir does not exist"),
            std::string::npos)
      << r.err;
}

// XLA_SPAWN_TRACE left in xla-spawn's own environment (a replica of a tracing job that runs
// xla-spawn itself) is not this job's: its replicas do not see it.
TEST(TimelineTest, AnInheritedXlaSpawnTraceIsNotPassedOn) {
  ScopedEnv inherited("XLA_SPAWN_TRACE", "/tmp/outer.json");
  const RunResult r = run_xla_spawn({"-n", "1", "--", helper_path(), "--do", "print-env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ENV XLA_SPAWN_TRACE=<unset>"), std::string::npos) << r.out;
}

// A replica that cannot create its part (here: a directory that is not there) says so and
// trains untraced: a timeline is never worth the job.
TEST(TimelineTest, AReplicaThatCannotWriteItsPartRunsUntraced) {
  const auto [status, out] = run_shell(fmt::format(
      "XLA_SPAWN_TRACE=/nonexistent-xs-dir/t.json {} --model mlp --batch-size 16 --epochs 1 "
      "--max-steps 3 --train-samples 4096 --no-eval",
      train_fmnist_path()));
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("ordinal 0 runs without tracing: XLA_SPAWN_TRACE /nonexistent-xs-dir/t.json: "
                     "directory /nonexistent-xs-dir does not exist"),
            std::string::npos)
      << out;
}

// Alone, XLA_SPAWN_TRACE gets the checks --trace gets, before any part is made: a directory
// or a FIFO at FILE left a part beside it at every run, and the merge refused it at exit.
TEST(TimelineTest, AProgramTracedAloneChecksItsFileBeforeWritingAPart) {
  TempDir dir;
  const std::string adir = dir.path() + "/adir";
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(::mkdir(adir.c_str(), 0700), 0);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& file : {adir, fifo}) {
    const auto [status, out] = run_shell(fmt::format(
        "env -u XLA_SPAWN_JOB_ID XLA_SPAWN_TRACE={} {} --model mlp --batch-size 16 --epochs 1 "
        "--max-steps 2 --train-samples 4096 --no-eval",
        file, train_fmnist_path()));
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("runs without tracing: XLA_SPAWN_TRACE " + file +
                       ": exists and is not a regular file"),
              std::string::npos)
        << out;
  }
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path())) {
    EXPECT_FALSE(entry.path().string().ends_with(".part")) << entry.path() << " left behind";
  }
}

// A program traced alone, outside any xla-spawn job, has no launcher to merge its part: it
// writes the trace itself at exit, and leaves no part behind.
TEST(TimelineTest, AProgramTracedAloneWritesItsTraceAtExit) {
  if (!has_python3()) GTEST_SKIP() << "python3 is missing (scripts/check-trace needs it)";
  TempDir dir;
  const std::string file = dir.path() + "/alone.json";
  const auto [status, out] = run_shell(fmt::format(
      "env -u XLA_SPAWN_JOB_ID XLA_SPAWN_TRACE={} {} --model mlp --batch-size 16 --epochs 1 "
      "--max-steps 3 --train-samples 4096 --no-eval",
      file, train_fmnist_path()));
  EXPECT_EQ(status, 0) << out;
  // In its own name: no xla-spawn was involved.
  EXPECT_NE(out.find("train_fmnist: trace of "), std::string::npos) << out;
  EXPECT_EQ(out.find("xla-spawn:"), std::string::npos) << out;
  EXPECT_NE(out.find(" span(s) written to " + file), std::string::npos) << out;
  const auto [checked, report] =
      check_trace(fmt::format("'{}' --ordinals 1 --require mark_step --require run", file));
  EXPECT_EQ(checked, 0) << report;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_FALSE(entry.path().string().ends_with(".part")) << entry.path() << " left behind";
  }
}

// A trace is data from anywhere: JSON of the wrong shape is named, line by line, never a
// Python traceback (each of these was one), and a trace of nothing or with one ordinal's
// track twice is not called good.
TEST(TimelineTest, TheTraceToolsNameWhatIsWrongWithAMalformedTrace) {
  if (!has_python3()) GTEST_SKIP() << "python3 is missing (scripts/check-trace needs it)";
  TempDir dir;
  const std::string file = dir.path() + "/bad.json";
  const std::string track0 =
      R"({"ph":"M","name":"process_name","pid":0,"args":{"name":"ordinal 0"}})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"traceEvents":[1]})", "an event that is not an object"},
      {R"({"traceEvents":[{"ph":"M","name":"process_name","pid":0}]})",
       "process_name without an integer pid and args.name"},
      {R"({"traceEvents":[)" + track0 + R"(,{"ph":"X","name":"a","ts":0,"dur":1,"pid":[0],"tid":0}]})",
       "span whose pid or tid is not an integer"},
      {R"({"traceEvents":[)" + track0 + R"(,{"ph":"X","name":"a","ts":0,"dur":"x","pid":0,"tid":0}]})",
       "span whose ts or dur is not a number within"},
      {R"({"traceEvents":[)" + track0 + R"(,{"ph":"X","name":"a","ts":NaN,"dur":1,"pid":0,"tid":0}]})",
       "NaN is not a JSON number"},
      {"[1, 2, 3]", "no traceEvents list"},
      {R"({"traceEvents":[]})", "no tracks: the trace holds nothing"},
      {R"({"traceEvents":[)" + track0 +
           R"(,{"ph":"M","name":"process_name","pid":1,"args":{"name":"ordinal 0"}}]})",
       "tracks 0 and 1 are both named 'ordinal 0'"},
      {R"({"traceEvents":[)" + track0 + R"(,{"ph":"X","name":"a","ts":1)" + std::string(400, '0') +
           R"(,"dur":1,"pid":0,"tid":0}]})",
       "span whose ts or dur is not a number within"},
      {R"({"traceEvents":[)" + track0 + R"(,{"ph":["X"],"name":"a"}]})",
       "an event that is neither a complete span (ph X) nor metadata (ph M)"},
      {R"({"traceEvents":[{"ph":"M","name":"process_name","pid":0,"args":{"name":"ordinal )" +
           std::string(5000, '9') + R"("}}]})",
       "not 'ordinal K'"},
  };
  for (const auto& [json, problem] : cases) {
    { std::ofstream(file, std::ios::trunc) << json; }
    const auto [status, out] = check_trace("'" + file + "' --ordinals 1");
    EXPECT_EQ(status, 1) << json << "\n" << out;
    EXPECT_NE(out.find(problem), std::string::npos) << json << "\n" << out;
    EXPECT_EQ(out.find("Traceback"), std::string::npos) << json << "\n" << out;
    const auto [plotted, plot_out] = run_shell(
        fmt::format("python3 {} '{}' -o '{}/bad.png' --from 0", XS_PLOT_TRACE_SCRIPT, file, dir.path()));
    EXPECT_NE(plotted, 0) << json << "\n" << plot_out;
    EXPECT_EQ(plot_out.find("Traceback"), std::string::npos) << json << "\n" << plot_out;
  }
  // Arguments that cannot draw anything are usage errors.
  for (const char* bad : {"--steps 0", "--steps -2", "--from -1", "-o /nonexistent-xs/x.png"}) {
    const auto [status, out] =
        run_shell(fmt::format("python3 {} '{}' {}", XS_PLOT_TRACE_SCRIPT, file, bad));
    EXPECT_EQ(status, 2) << bad << "\n" << out;
    EXPECT_EQ(out.find("Traceback"), std::string::npos) << bad << "\n" << out;
  }
}

// Two jobs given the same --trace at once: the one that ends first writes FILE, and the other
// finds FILE written by someone else and puts its own trace beside it. Before, the later
// merge silently replaced the earlier job's timeline.
TEST(TimelineTest, TwoJobsGivenTheSameTraceFileKeepBothTimelines) {
  TempDir dir;
  const std::string file = dir.path() + "/same.json";
  const std::string done = dir.path() + "/done";
  const std::string step = fmt::format(
      "'{}' --model mlp --batch-size 16 --epochs 1 --max-steps 1 --train-samples 4096 --no-eval",
      train_fmnist_path());
  // A: one traced step, then waits (at most 60 s) for B to have ended.
  Launch a({"-n", "1", "--trace", file, "--", "/bin/sh", "-c",
            fmt::format("{} && for i in $(seq 1200); do [ -e '{}' ] && exit 0; sleep 0.05; done; "
                        "exit 9",
                        step, done)});
  const RunResult b =
      run_xla_spawn({"-n", "1", "--trace", file, "--", "/bin/sh", "-c", step});
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_NE(b.err.find("written to " + file), std::string::npos) << b.err;
  const std::string b_trace = read_file(file);
  { std::ofstream(done) << "1"; }
  const int status = a.wait_or_fail(std::chrono::seconds(90));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << a.err();
  EXPECT_NE(a.err().find(file + " changed during this job (another job given the same file?); "
                         "this job's trace goes to " + dir.path() + "/same.xs-"),
            std::string::npos)
      << a.err();
  EXPECT_EQ(read_file(file), b_trace) << "B's timeline was replaced";
  size_t traces = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    const std::string name = entry.path().filename().string();
    EXPECT_FALSE(name.ends_with(".part")) << name << " left behind";
    if (name.starts_with("same.") && name.ends_with(".json")) {
      ++traces;
      EXPECT_NE(read_file(entry.path().string()).find("\"mark_step\""), std::string::npos) << name;
    }
  }
  EXPECT_EQ(traces, 2u);
}

// A FILE removed during the job protects nothing: the trace is written there, not beside it.
TEST(TimelineTest, AFileRemovedDuringTheJobIsWrittenAgain) {
  TempDir dir;
  const std::string file = dir.path() + "/gone.json";
  { std::ofstream(file) << R"({"traceEvents":[]})"; }
  const RunResult r = run_xla_spawn(
      {"-n", "1", "--trace", file, "--", "/bin/sh", "-c",
       fmt::format("'{}' --model mlp --batch-size 16 --epochs 1 --max-steps 1 --train-samples "
                   "4096 --no-eval && rm '{}'",
                   train_fmnist_path(), file)});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("changed during this job"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("written to " + file), std::string::npos) << r.err;
  EXPECT_TRUE(std::filesystem::exists(file));
}

// A launcher SIGKILLed during a traced job merges nothing; its reaper does, beside FILE (which
// may be another job's by now), from what the replicas had flushed, and removes the parts.
TEST(TimelineTest, TheReaperOfASigkilledLauncherWritesTheTimelineBesideTheFile) {
  TempDir dir;
  const std::string file = dir.path() + "/killed.json";
  Launch run({"-n", "2", "--trace", file, "--", helper_path(), "--do", "trace-span", "--then",
              "sleep:60"});
  const auto parts = [&] {
    int n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
      n += entry.path().extension() == ".part" && entry.file_size() > 0 ? 1 : 0;
    }
    return n;
  };
  ASSERT_TRUE(wait_until([&] { return parts() == 2; }, scaled(std::chrono::seconds(30))))
      << run.err();
  // As if the launcher died while merging: its temporary goes too.
  const std::string temp = fmt::format("{}.merging.{}", file, run.pid());
  { std::ofstream(temp) << "half a trace"; }
  ASSERT_EQ(::kill(run.pid(), SIGKILL), 0);
  ASSERT_TRUE(run.wait_for(std::chrono::seconds(10)).has_value());
  std::string err;
  ASSERT_TRUE(wait_until([&] { return (err = run.err()).find("span(s) written to ") != std::string::npos; },
                         scaled(std::chrono::seconds(10))))
      << err;
  EXPECT_NE(err.find("the replicas' trace of 2 span(s) written to " + dir.path() + "/killed.xs-"),
            std::string::npos)
      << err;
  EXPECT_FALSE(std::filesystem::exists(file));
  EXPECT_FALSE(std::filesystem::exists(temp)) << "the launcher's merge temporary is left";
  EXPECT_EQ(parts(), 0) << "parts left behind";
  // The replicas started nothing of their own: none is counted as such.
  EXPECT_EQ(err.find("started outside them"), std::string::npos) << err;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("killed.xs-")) continue;
    if (has_python3()) {
      const auto [status, out] = check_trace(entry.path().string());
      EXPECT_EQ(status, 0) << out;
    }
    EXPECT_NE(read_file(entry.path().string()).find("\"helper\""), std::string::npos) << name;
  }
}

// Replicas that record nothing (here: /bin/true, without xla-spawn's library) leave no part:
// no empty file is written and called a trace.
TEST(TimelineTest, AJobWhoseReplicasRecordedNothingWritesNoTrace) {
  TempDir dir;
  const std::string file = dir.path() + "/none.json";
  const RunResult r = run_xla_spawn({"-n", "2", "--trace", file, "--", "/bin/true"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("no trace written to " + file + ": no replica wrote a part"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(file));
}

// A device, a directory or a link is never replaced by the merged file.
TEST(TimelineTest, ATraceFileThatIsNotARegularFileIsRefusedBeforeAnythingStarts) {
  TempDir dir;
  for (const std::string& file : {std::string("/dev/null"), dir.path(), std::string(".")}) {
    const RunResult r = run_xla_spawn({"-n", "2", "--trace", file, "--", helper_path(), "--do", "exit:0"});
    EXPECT_EQ(r.exit_code, 2) << file << ": " << r.err;
  }
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

// A file at FILE that is not an earlier trace (a checkpoint or a CSV given the same name) is
// someone's work: refused before anything starts, and kept when it appears during the job
// (the trace goes beside it, and the launcher says where). An earlier trace is replaced, also
// one reformatted by a JSON tool.
TEST(TimelineTest, TheMergeNeverReplacesAFileThatIsNotATrace) {
  TempDir dir;
  const std::string file = dir.path() + "/work.bin";
  { std::ofstream(file) << "XSCKPT\r\n not a trace"; }
  RunResult r = run_xla_spawn({"-n", "1", "--trace", file, "--", helper_path(), "--do", "exit:0"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--trace " + file + ": exists and is not a trace"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(file), "XSCKPT\r\n not a trace");
  ASSERT_EQ(::unlink(file.c_str()), 0);
  // The replica traces a step, then puts its own file at FILE.
  r = run_xla_spawn({"-n", "1", "--trace", file, "--", "/bin/sh", "-c",
                     fmt::format("'{}' --model mlp --batch-size 16 --epochs 1 --max-steps 1 "
                                 "--train-samples 4096 --no-eval && printf XSCKPT > '{}'",
                                 train_fmnist_path(), file)});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(file), "XSCKPT");
  EXPECT_NE(r.err.find(file + " changed during this job"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("this job's trace goes to " + dir.path() + "/work.xs-"), std::string::npos)
      << r.err;
  // 4 KiB of blank lines before the data: not an empty file.
  { std::ofstream(file, std::ios::trunc) << std::string(4096, '\n') << "IMPORTANT DATA\n"; }
  r = run_xla_spawn({"-n", "1", "--trace", file, "--", helper_path(), "--do", "exit:0"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(read_file(file).find("IMPORTANT DATA"), std::string::npos);
  { std::ofstream(file, std::ios::trunc) << "{\n  \"traceEvents\": [\n  ]\n}\n"; }
  r = run_xla_spawn({"-n", "1", "--trace", file, "--", helper_path(), "--do", "exit:0"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("written to " + file), std::string::npos) << r.err;
}

}  // namespace
}  // namespace xs::testing
