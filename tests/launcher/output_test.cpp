// Output: line-whole under concurrent writers, the "[k] " prefix and its options, log files,
// console filtering, and the partial last line.

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/launcher/launch_support.h"

namespace xs::testing {
namespace {

class InterleaveTest : public ::testing::TestWithParam<int> {};

// Each helper writes COUNT lines "L <k> <seq> <pad> END" in chunks cut mid-line; every line on
// the console must come out whole, tagged with its own ordinal, in order, none missing.
TEST_P(InterleaveTest, LinesNeverInterleaveUnderConcurrentWriters) {
  const int n = GetParam();
  constexpr int kLines = 3000;
  constexpr int kPad = 100;
  const RunResult r =
      run_xla_spawn({"-n", std::to_string(n), "--", helper_path(), "--do",
                     "lines:" + std::to_string(kLines) + ":" + std::to_string(kPad)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::regex whole(R"(\[(\d+)\] L (\d+) (\d+) (x+) END)");
  std::map<int, int> next_seq;
  std::istringstream in(r.out);
  std::string line;
  int bad = 0;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, whole) || m[1] != m[2] || m[4].length() != kPad) {
      if (++bad <= 5) ADD_FAILURE() << "broken line: '" << line.substr(0, 200) << "'";
      continue;
    }
    const int ordinal = std::stoi(m[1]);
    const int seq = std::stoi(m[3]);
    EXPECT_EQ(seq, next_seq[ordinal]) << "ordinal " << ordinal << " out of order";
    next_seq[ordinal] = seq + 1;
  }
  EXPECT_EQ(bad, 0);
  ASSERT_EQ(next_seq.size(), static_cast<size_t>(n));
  for (const auto& [ordinal, count] : next_seq) EXPECT_EQ(count, kLines) << "ordinal " << ordinal;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, InterleaveTest, ::testing::Values(2, 8),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

TEST(OutputTest, StderrLinesAreTaggedOnStderr) {
  const RunResult r =
      run_xla_spawn({"-n", "2", "--", "/bin/sh", "-c", "echo out-$RANK; echo err-$RANK >&2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[1] out-1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[1] err-1\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("err-"), std::string::npos) << r.out;
}

TEST(OutputTest, NoPrefixPrintsLinesBare) {
  const RunResult r = run_xla_spawn({"-n", "2", "--no-prefix", "--", "/bin/echo", "hello"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "hello\nhello\n");
}

TEST(OutputTest, TimestampPrecedesEachLineOnTheConsoleAndInLogFiles) {
  TempDir dir;
  const RunResult r = run_xla_spawn(
      {"-n", "1", "--timestamp", "--log-dir", dir.path(), "--", "/bin/echo", "hello"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_match(r.out, std::regex(R"(\[0\] \d\d:\d\d:\d\d\.\d\d\d hello\n)")))
      << r.out;
  const std::string log = read_file(dir / "ordinal-0.log");
  EXPECT_TRUE(std::regex_match(log, std::regex(R"(\d\d:\d\d:\d\d\.\d\d\d hello\n)"))) << log;
}

TEST(OutputTest, PartialLastLineIsFlushedAtExit) {
  const RunResult r = run_xla_spawn({"-n", "2", "--", helper_path(), "--do", "partial"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[0] no newline at the end\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[1] no newline at the end\n"), std::string::npos) << r.out;
}

TEST(OutputTest, LogDirKeepsEveryOrdinalsLinesWhileShowOrdinalsFiltersTheConsole) {
  TempDir dir;
  const std::string logs = dir / "logs";  // does not exist yet: xla-spawn creates it
  const RunResult r = run_xla_spawn({"-n", "4", "--log-dir", logs, "--show-ordinals", "0,2-3", "--",
                                     "/bin/sh", "-c", "echo out $RANK; echo err $RANK >&2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[0] out 0\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[1]"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find("[1]"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("[2] out 2\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[3] out 3\n"), std::string::npos) << r.out;
  for (int k = 0; k < 4; ++k) {
    const std::string text = read_file(logs + "/ordinal-" + std::to_string(k) + ".log");
    const std::string kk = std::to_string(k);
    EXPECT_NE(text.find("out " + kk + "\n"), std::string::npos) << text;
    EXPECT_NE(text.find("err " + kk + "\n"), std::string::npos) << text;
    EXPECT_EQ(text.find('['), std::string::npos) << "log files carry no prefix: " << text;
  }
}

// A line far over the 64 KiB cap stays whole in the log files and on a console that shows one
// replica; on a console that several share, it comes in 64 KiB lines, each all of one replica.
TEST(OutputTest, AnOverlongLineStaysWholeWhereNoOtherReplicaWritesAndNeverMixes) {
  TempDir dir;
  const std::vector<std::string> command = {
      "--", "/bin/sh", "-c", "head -c 200000 /dev/zero | tr '\\0' \"$RANK\"; echo; echo done"};
  std::vector<std::string> one = {"-n", "2", "--log-dir", dir.path(), "--show-ordinals", "0"};
  one.insert(one.end(), command.begin(), command.end());
  RunResult r = run_xla_spawn(one);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out == "[0] " + std::string(200000, '0') + "\n[0] done\n")
      << r.out.size() << " bytes: " << r.out.substr(0, 100);
  for (int k = 0; k < 2; ++k) {
    const std::string log = read_file(dir / fmt::format("ordinal-{}.log", k));
    EXPECT_TRUE(log == std::string(200000, static_cast<char>('0' + k)) + "\ndone\n")
        << log.size() << " bytes";
  }
  std::vector<std::string> shared = {"-n", "2"};
  shared.insert(shared.end(), command.begin(), command.end());
  r = run_xla_spawn(shared);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  size_t digits[2] = {0, 0};
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.ends_with("done")) continue;
    ASSERT_TRUE(line.starts_with("[0] ") || line.starts_with("[1] ")) << line.substr(0, 100);
    const char own = line[1];
    const std::string text = line.substr(4);
    EXPECT_LE(text.size(), size_t{64} << 10);
    EXPECT_EQ(text.find_first_not_of(own), std::string::npos) << "mixed: " << line.substr(0, 100);
    digits[own - '0'] += text.size();
  }
  EXPECT_EQ(digits[0], 200000u);
  EXPECT_EQ(digits[1], 200000u);
}

// Started with stdout closed, xla-spawn says that stdout lines are dropped, and the replicas'
// stderr still comes out on stderr, apart (a pipe once took fd 1 and the streams mixed).
TEST(OutputTest, AClosedStdoutIsSaidAndStderrStillComesThrough) {
  Launch run({"/bin/sh", "-c",
              "exec \"$0\" -n 2 -- /bin/sh -c 'echo out $RANK; echo err $RANK >&2' >&-",
              xla_spawn_path()},
             /*raw=*/true);
  const int status = run.wait_or_fail(std::chrono::seconds(60));
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << run.err();
  const std::string err = run.err();
  EXPECT_NE(err.find("xla-spawn: stdout is closed: the replicas' stdout lines are dropped"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("[0] err 0\n"), std::string::npos) << err;
  EXPECT_NE(err.find("[1] err 1\n"), std::string::npos) << err;
  EXPECT_EQ(err.find("] out "), std::string::npos) << err;
  EXPECT_EQ(run.out(), "");
}

// A log file is never reached through a symlink planted in the log directory (the target
// stays as it was, the job fails naming the file), and is owner-only under a umask of 0.
TEST(OutputTest, LogFilesAreOwnerOnlyAndNeverFollowASymlink) {
  TempDir dir;
  const std::string logs = dir / "logs";
  const std::string target = dir / "target";
  ASSERT_TRUE(std::filesystem::create_directory(logs));
  {
    std::ofstream(target) << "keep\n";
  }
  std::filesystem::create_symlink(target, logs + "/ordinal-1.log");
  const mode_t old_mask = ::umask(0);
  const RunResult planted =
      run_xla_spawn({"-n", "2", "--log-dir", logs, "--", "/bin/sh", "-c", "echo hi"});
  std::filesystem::remove(logs + "/ordinal-1.log");
  const RunResult clean =
      run_xla_spawn({"-n", "2", "--log-dir", logs, "--", "/bin/sh", "-c", "echo hi"});
  ::umask(old_mask);
  EXPECT_EQ(planted.exit_code, 1) << planted.err;  // xla-spawn's own failure, not a usage error
  EXPECT_NE(planted.err.find("ordinal-1.log"), std::string::npos) << planted.err;
  EXPECT_EQ(read_file(target), "keep\n");
  ASSERT_EQ(clean.exit_code, 0) << clean.err;
  for (int k = 0; k < 2; ++k) {
    struct stat st {};
    const std::string log = logs + "/ordinal-" + std::to_string(k) + ".log";
    ASSERT_EQ(::stat(log.c_str(), &st), 0) << log;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << log;
  }
}

TEST(OutputTest, ALogDirThatCannotBeADirectoryIsABadValue) {
  TempDir dir;
  const std::string file = dir / "file";
  std::ofstream(file) << "x\n";
  const RunResult r = run_xla_spawn({"-n", "1", "--log-dir", file, "--", "/bin/true"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--log-dir " + file + ": cannot create directory"), std::string::npos)
      << r.err;
  // A directory in which no file can be made: named as the flag's value, before any start.
  const RunResult proc = run_xla_spawn({"-n", "1", "--log-dir", "/proc/self", "--", "/bin/true"});
  EXPECT_EQ(proc.exit_code, 2) << proc.err;
  EXPECT_NE(proc.err.find("--log-dir /proc/self: cannot open ordinal-0.log"), std::string::npos)
      << proc.err;
}

TEST(OutputTest, FailureSummaryShowsHiddenRootCauseLines) {
  const RunResult r = run_xla_spawn({"-n", "2", "--show-ordinals", "0", "--", "/bin/sh", "-c",
                                     "if [ $RANK = 1 ]; then echo last words; exit 5; fi"});
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_EQ(r.out.find("last words"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[1] last words"), std::string::npos) << r.err;
}

TEST(OutputTest, BackgroundGrandchildHoldingThePipeDoesNotHoldTheJob) {
  // The replica exits at once; its `sleep 4` keeps the stdout pipe open for 4 s.
  const RunResult r =
      run_xla_spawn({"-n", "2", "--", "/bin/sh", "-c", "sleep 4 & echo started $RANK"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[1] started 1\n"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 3.0) << "xla-spawn waited for the grandchild's EOF";
}

}  // namespace
}  // namespace xs::testing
