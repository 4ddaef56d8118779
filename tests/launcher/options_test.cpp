// The command line, the ordinal-set syntax and the PATH lookup, without forking anything.

#include "xla_spawn/launcher/options.h"

#include <sched.h>

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "xla_spawn/launcher/command_path.h"
#include "xla_spawn/launcher/ordinal_set.h"
#include "tests/support/scoped_env.h"

namespace xs {
namespace {

CommandLine parse(std::vector<std::string> args) {
  args.insert(args.begin(), "xla-spawn");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

TEST(OptionsTest, DefaultsFollowTheDocumentation) {
  const CommandLine cl = parse({"--", "train", "--epochs", "3"});
  EXPECT_EQ(cl.nprocs, default_nprocs());
  EXPECT_EQ(cl.command, (std::vector<std::string>{"train", "--epochs", "3"}));
  EXPECT_TRUE(cl.supervisor.output.prefix);
  EXPECT_FALSE(cl.supervisor.output.timestamp);
  EXPECT_EQ(cl.supervisor.grace, std::chrono::seconds(3));
  EXPECT_EQ(cl.supervisor.timeout.count(), 0);
  EXPECT_EQ(cl.supervisor.max_restarts, 0);
  EXPECT_EQ(cl.supervisor.bind_cores, CoreBinding::kAuto);
}

// Under taskset or a container's cpuset the default is the CPUs xla-spawn may use, not every
// CPU online.
TEST(OptionsTest, TheDefaultReplicaCountIsTheCpusThisProcessMayUse) {
  cpu_set_t saved;
  ASSERT_EQ(::sched_getaffinity(0, sizeof saved, &saved), 0);
  int first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
  const int nprocs = parse({"--", "train"}).nprocs;
  ASSERT_EQ(::sched_setaffinity(0, sizeof saved, &saved), 0);
  EXPECT_EQ(nprocs, 1);
  EXPECT_EQ(parse({"--", "train"}).nprocs, std::min(CPU_COUNT(&saved), 1024));
}

TEST(OptionsTest, EveryOptionIsParsed) {
  const CommandLine cl = parse({"-n", "6", "--no-prefix", "--timestamp", "--log-dir", "/tmp/l",
                                "--show-ordinals", "1,3-4", "--grace-period", "0.25", "--timeout",
                                "90", "--bind-cores", "--max-restarts", "2", "--", "prog"});
  EXPECT_EQ(cl.nprocs, 6);
  EXPECT_FALSE(cl.supervisor.output.prefix);
  EXPECT_TRUE(cl.supervisor.output.timestamp);
  EXPECT_EQ(cl.supervisor.output.log_dir, "/tmp/l");
  EXPECT_EQ(cl.supervisor.output.shown, (std::vector<bool>{false, true, false, true, true, false}));
  EXPECT_EQ(cl.supervisor.grace, std::chrono::milliseconds(250));
  EXPECT_EQ(cl.supervisor.timeout, std::chrono::seconds(90));
  EXPECT_EQ(cl.supervisor.bind_cores, CoreBinding::kOn);
  EXPECT_EQ(cl.supervisor.max_restarts, 2);
}

TEST(OptionsTest, CommandStartsAtFirstNonOptionWithoutDashDash) {
  const CommandLine cl = parse({"-n", "2", "--timeout", "5", "prog", "-n", "9"});
  EXPECT_EQ(cl.nprocs, 2);
  EXPECT_EQ(cl.command, (std::vector<std::string>{"prog", "-n", "9"}));
}

TEST(OptionsTest, AttachedValuesAndMpirunNp) {
  EXPECT_EQ(parse({"-n4", "prog"}).nprocs, 4);
  EXPECT_EQ(parse({"--nprocs=5", "prog"}).nprocs, 5);
  EXPECT_EQ(parse({"-np", "7", "prog"}).nprocs, 7);
}

TEST(OptionsTest, BadValuesThrowUsageErrorNamingFlagAndValue) {
  EXPECT_THROW(parse({"-n", "0", "prog"}), UsageError);
  EXPECT_THROW(parse({"-n", "1025", "prog"}), UsageError);
  EXPECT_THROW(parse({"--grace-period", "nan", "prog"}), UsageError);
  EXPECT_THROW(parse({"--timeout", "inf", "prog"}), UsageError);
  // Under a millisecond would round to 0, which means no limit: refused, not ignored.
  EXPECT_THROW(parse({"--timeout", "0.0004", "prog"}), UsageError);
  EXPECT_THROW(parse({"--grace-period", "1e-9", "prog"}), UsageError);
  EXPECT_EQ(parse({"--timeout", "0", "prog"}).supervisor.timeout.count(), 0);
  EXPECT_EQ(parse({"--timeout", "0.001", "prog"}).supervisor.timeout.count(), 1);
  try {
    parse({"-n", "-2", "prog"});
    FAIL() << "negative nprocs accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--nprocs='-2': out of range, expected an integer in [1, 1024]");
    EXPECT_FALSE(e.show_usage());
  }
}

TEST(OptionsTest, HelpNeedsNoCommand) {
  EXPECT_TRUE(parse({"--help"}).help);
}

TEST(OrdinalSetTest, ParsesListsAndRanges) {
  EXPECT_EQ(parse_ordinal_set("0,2-3", 4), (std::vector<bool>{true, false, true, true}));
  EXPECT_EQ(parse_ordinal_set("3", 4), (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(parse_ordinal_set("0-1,1", 2), (std::vector<bool>{true, true}));
}

TEST(OrdinalSetTest, RejectsOutOfRangeReversedAndEmptyItems) {
  EXPECT_THROW(parse_ordinal_set("4", 4), InvalidArgument);
  EXPECT_THROW(parse_ordinal_set("3-1", 4), InvalidArgument);
  EXPECT_THROW(parse_ordinal_set("0,,1", 4), InvalidArgument);
  EXPECT_THROW(parse_ordinal_set("", 4), InvalidArgument);
  EXPECT_THROW(parse_ordinal_set("-1", 4), InvalidArgument);
}

TEST(CommandPathTest, SearchesPathInOrder) {
  testing::ScopedEnv path("PATH", "/nonexistent:/bin:/usr/bin");
  EXPECT_EQ(resolve_command("sh"), "/bin/sh");
  EXPECT_THROW(resolve_command("no-such-program-xs"), CommandNotFound);
}

// PATH set but empty is the current directory alone, as for a shell: not the default path.
TEST(CommandPathTest, AnEmptyPathSearchesTheCurrentDirectoryOnly) {
  testing::ScopedEnv path("PATH", "");
  EXPECT_THROW(resolve_command("sh"), CommandNotFound);
  testing::ScopedEnv unset("PATH", std::nullopt);
  EXPECT_NO_THROW(resolve_command("sh"));  // the default path
}

TEST(CommandPathTest, NameWithSlashIsUsedAsIs) {
  EXPECT_EQ(resolve_command("/bin/sh"), "/bin/sh");
  EXPECT_THROW(resolve_command("/etc/passwd"), CommandNotFound);  // not executable
  EXPECT_THROW(resolve_command("/tmp"), CommandNotFound);         // a directory
}

}  // namespace
}  // namespace xs
