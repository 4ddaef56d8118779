// Bad input gets a clear message and a non-zero exit before anything is forked: usage
// errors exit 2, a command that cannot be run exits 127 naming it.

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/launcher/launch_support.h"
#include "tests/support/scoped_env.h"

namespace xs::testing {
namespace {

struct BadInput {
  const char* name;
  std::vector<std::string> options;  // before "-- helper"
  int exit_code;
  const char* message;  // must appear in stderr
};

class BadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputTest, RejectedWithMessageBeforeAnythingIsForked) {
  const BadInput c = GetParam();
  TempDir dir;
  std::vector<std::string> args = c.options;
  for (const std::string& a :
       {std::string("--"), helper_path(), std::string("--pid-dir"), dir.path()}) {
    args.push_back(a);
  }
  const RunResult r = run_xla_spawn(args);
  EXPECT_EQ(r.exit_code, c.exit_code) << r.err;
  EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "a replica was started";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadInputTest,
    ::testing::Values(
        BadInput{"ZeroReplicas", {"-n", "0"}, 2, "--nprocs='0': out of range"},
        BadInput{"ContradictoryBinding", {"--bind-cores", "--no-bind-cores"}, 2, "contradict"},
        BadInput{"NegativeReplicas", {"-n", "-3"}, 2, "--nprocs='-3': out of range"},
        BadInput{"NegativeReplicasLongForm", {"--nprocs=-1"}, 2, "--nprocs='-1'"},
        BadInput{"NonNumericReplicas", {"-n", "four"}, 2, "--nprocs='four': expected an integer"},
        BadInput{"FractionalReplicas", {"-n", "1.5"}, 2, "--nprocs='1.5'"},
        BadInput{"AbsurdReplicas", {"-n", "100000"}, 2, "[1, 1024]"},
        BadInput{"EmptyReplicas", {"--nprocs="}, 2, "--nprocs"},
        BadInput{"UnknownOption", {"--frobnicate"}, 2, "unrecognised option '--frobnicate'"},
        BadInput{"UnknownOptionShowsUsage", {"--frobnicate"}, 2, "usage: xla-spawn"},
        BadInput{"ShowOrdinalOutOfRange",
                 {"-n", "2", "--show-ordinals", "0,5"},
                 2,
                 "--show-ordinals='5'"},
        BadInput{
            "ShowOrdinalsGarbage", {"-n", "2", "--show-ordinals", "a-b"}, 2, "--show-ordinals='a'"},
        BadInput{"NegativeGrace", {"--grace-period", "-1"}, 2, "--grace-period='-1'"},
        BadInput{"NonNumericTimeout", {"--timeout", "soon"}, 2, "--timeout='soon'"},
        BadInput{"NegativeRestarts", {"--max-restarts", "-1"}, 2, "--max-restarts='-1'"},
        BadInput{"AbsurdRestarts", {"--max-restarts", "1001"}, 2, "[0, 1000]"},
        BadInput{"ZeroNodes", {"--nnodes", "0"}, 2, "--nnodes='0': out of range"},
        BadInput{"AbsurdNodes", {"--nnodes", "4097"}, 2, "[1, 4096]"},
        BadInput{"NodeRankPastNodes", {"--nnodes", "2", "--node-rank", "2"}, 2,
                 "must be less than --nnodes 2"},
        BadInput{"PortZero", {"--master-port", "0"}, 2, "--master-port='0': out of range"},
        BadInput{"PortPastRange", {"--master-port", "65536"}, 2, "[1, 65535]"},
        BadInput{"ZeroRendezvousTimeout", {"--rdzv-timeout", "0"}, 2, "[1, 86400]"},
        BadInput{"EmptyTracePath", {"--trace", ""}, 2, "--trace: empty path"},
        BadInput{"EmptyLogDir", {"--log-dir", ""}, 2, "--log-dir: empty path"}),
    [](const auto& info) { return std::string(info.param.name); });

// The replicas' own settings that every job reads: each replica used to fail with the same
// error, or, for the waits' settings, only the first collective that waited long enough.
TEST(BadInputTest, AReplicaSettingIsCheckedBeforeTheReplicasStart) {
  for (const auto& [name, value, says] :
       {std::tuple{"XLA_SPAWN_COLLECTIVE_TIMEOUT_MS", "soon", "expected an integer in [1, 86400000]"},
        std::tuple{"XLA_SPAWN_SPIN_US", "-5", "out of range"},
        std::tuple{"XLA_SPAWN_YIELD_US", "2000000", "out of range"},
        std::tuple{"XLA_SPAWN_LOG_LEVEL", "loud", "expected one of trace, debug, info"},
        std::tuple{"XLA_SPAWN_DEBUG_REPLICAS", "maybe", "expected a boolean"}}) {
    TempDir dir;
    ScopedEnv bad(name, value);
    const RunResult r = run_xla_spawn({"-n", "2", "--", helper_path(), "--pid-dir", dir.path()});
    EXPECT_EQ(r.exit_code, 2) << name << ": " << r.err;
    EXPECT_NE(r.err.find(fmt::format("{}='{}': ", name, value)), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("(a setting of the replicas, checked before they start)"),
              std::string::npos)
        << r.err;
    EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << name << ": a replica was started";
  }
}

TEST(BadInputTest, NoCommandIsAUsageError) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"-n", "2"}, std::vector<std::string>{"-n", "2", "--"}}) {
    const RunResult r = run_xla_spawn(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("no command given"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("usage: xla-spawn"), std::string::npos) << r.err;
  }
}

TEST(BadInputTest, CommandNotFoundExits127NamingIt) {
  const RunResult r = run_xla_spawn({"-n", "2", "--", "no-such-command-xs"});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_EQ(r.err, "xla-spawn: command not found: no-such-command-xs\n");
  EXPECT_EQ(r.out, "");
}

TEST(BadInputTest, MissingPathExits127NamingIt) {
  const RunResult r = run_xla_spawn({"-n", "2", "--", "/no/such/dir/prog"});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_NE(r.err.find("command not found: /no/such/dir/prog"), std::string::npos) << r.err;
}

// DIR/NAME holding `contents`, with mode `mode`; its path.
std::string program_file(const TempDir& dir, const std::string& name, const std::string& contents,
                         mode_t mode = 0755) {
  const std::string path = dir / name;
  std::ofstream(path, std::ios::binary) << contents;
  ::chmod(path.c_str(), mode);
  return path;
}

TEST(BadInputTest, NonExecutableFileExits127NamingIt) {
  TempDir dir;
  const std::string script = program_file(dir, "script.sh", "#!/bin/sh\necho hi\n", 0644);
  const RunResult r = run_xla_spawn({"-n", "2", "--", script});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_NE(r.err.find("command is not executable: " + script), std::string::npos) << r.err;
}

// A script whose interpreter is missing is named with it before any replica starts (it used
// to fail in every replica with ENOENT, which named the script, an existing file).
TEST(BadInputTest, AScriptsMissingInterpreterExits127NamingItBeforeAnythingStarts) {
  TempDir dir;
  const std::string script =
      program_file(dir, "script.sh", "#!/no/such/interpreter -x\necho hi\n");
  const RunResult r = run_xla_spawn({"-n", "2", "--", script});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_EQ(r.err,
            "xla-spawn: " + script + ": bad interpreter /no/such/interpreter: no such file\n");
}

// An executable text file without "#!" runs under /bin/sh, as a shell runs it.
TEST(BadInputTest, AScriptWithoutAnInterpreterLineRunsUnderSh) {
  TempDir dir;
  const std::string script = program_file(dir, "plain", "echo \"$RANK says $1\"\n");
  const RunResult r = run_xla_spawn({"-n", "2", "--", script, "hello"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[0] 0 says hello\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[1] 1 says hello\n"), std::string::npos) << r.out;
}

// "#!" without an interpreter is no script line for the kernel: /bin/sh runs the file, as in
// a shell.
TEST(BadInputTest, AnInterpreterLineWithoutAnInterpreterRunsUnderSh) {
  TempDir dir;
  const std::string script = program_file(dir, "bare", "#!\necho \"bare $RANK\"\n");
  const RunResult r = run_xla_spawn({"-n", "1", "--", script});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[0] bare 0\n"), std::string::npos) << r.out;
}

// A binary the kernel cannot run (another machine's, or garbage) is not fed to /bin/sh: it is
// said to be a binary, with a shell's 126.
TEST(BadInputTest, ABinaryThatCannotRunIsNotRunAsAScript) {
  TempDir dir;
  const std::string binary =
      program_file(dir, "foreign", std::string("\x7f" "ELF\x02\x01\x01\0\0\0garbage(", 17));
  const RunResult r = run_xla_spawn({"-n", "2", "--", binary});
  EXPECT_EQ(r.exit_code, 126) << r.err;
  EXPECT_NE(r.err.find("cannot execute binary file " + binary + ": Exec format error"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("Syntax error"), std::string::npos) << r.err;
}

TEST(BadInputTest, DirectoryExits127NamingIt) {
  TempDir dir;
  const RunResult r = run_xla_spawn({"-n", "2", "--", dir.path()});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_NE(r.err.find("command is a directory: " + dir.path()), std::string::npos) << r.err;
}

TEST(BadInputTest, HelpPrintsUsageAndExitsZero) {
  const RunResult r = run_xla_spawn({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("usage: xla-spawn [options] -- COMMAND"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--max-restarts"), std::string::npos) << r.out;
}

TEST(BadInputTest, VersionPrintsTheProjectsVersionAndExitsZero) {
  const RunResult r = run_xla_spawn({"--version"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, std::string("xla-spawn ") + XS_PROJECT_VERSION + "\n");
}

TEST(BadInputTest, CommandWithoutDashDashAndMpirunStyleNp) {
  const RunResult r = run_xla_spawn({"-np", "2", "/bin/echo", "--not-an-option"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[1] --not-an-option\n"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace xs::testing
