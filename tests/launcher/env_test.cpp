// Every replica gets the environment contract of replica/context.h: our names and torchrun's,
// one job id shared by the job and unique to it, attempt 0, no inherited segment.

#include <map>
#include <regex>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "tests/launcher/launch_support.h"

namespace xs::testing {
namespace {

using Env = std::map<std::string, std::string>;

// "[k] ENV NAME=VALUE" lines -> per-ordinal maps.
std::map<int, Env> parse_env(const std::string& out) {
  std::map<int, Env> env;
  for (const std::string& line : lines_with(out, "[")) {
    const size_t close = line.find("] ENV ");
    if (close == std::string::npos) continue;
    const int ordinal = std::stoi(line.substr(1, close - 1));
    const std::string assignment = line.substr(close + 6);
    const size_t eq = assignment.find('=');
    env[ordinal][assignment.substr(0, eq)] = assignment.substr(eq + 1);
  }
  return env;
}

class EnvTest : public ::testing::TestWithParam<int> {};

TEST_P(EnvTest, EachReplicaGetsItsOrdinalWorldSizeAndTheSharedJobId) {
  const int n = GetParam();
  const RunResult r =
      run_xla_spawn({"-n", std::to_string(n), "--", helper_path(), "--do", "print-env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::map<int, Env> env = parse_env(r.out);
  ASSERT_EQ(env.size(), static_cast<size_t>(n)) << r.out;
  std::set<std::string> job_ids;
  for (const auto& [ordinal, vars] : env) {
    const std::string k = std::to_string(ordinal);
    const std::string w = std::to_string(n);
    EXPECT_EQ(vars.at("XLA_SPAWN_ORDINAL"), k);
    EXPECT_EQ(vars.at("XLA_SPAWN_LOCAL_ORDINAL"), k);
    EXPECT_EQ(vars.at("XLA_SPAWN_WORLD_SIZE"), w);
    EXPECT_EQ(vars.at("XLA_SPAWN_LOCAL_WORLD_SIZE"), w);
    EXPECT_EQ(vars.at("RANK"), k);
    EXPECT_EQ(vars.at("LOCAL_RANK"), k);
    EXPECT_EQ(vars.at("WORLD_SIZE"), w);
    EXPECT_EQ(vars.at("LOCAL_WORLD_SIZE"), w);
    EXPECT_EQ(vars.at("XLA_SPAWN_ATTEMPT"), "0");
    EXPECT_EQ(vars.at("XLA_SPAWN_SEGMENT").rfind("/xla-spawn-", 0), 0u)
        << vars.at("XLA_SPAWN_SEGMENT");
    EXPECT_TRUE(std::regex_match(vars.at("XLA_SPAWN_JOB_ID"), std::regex("xs-[0-9]+-[0-9a-f]{8}")))
        << vars.at("XLA_SPAWN_JOB_ID");
    job_ids.insert(vars.at("XLA_SPAWN_JOB_ID"));
    EXPECT_EQ(vars.at("TORCHELASTIC_RUN_ID"), vars.at("XLA_SPAWN_JOB_ID"));
    EXPECT_EQ(vars.at("TORCHELASTIC_RESTART_COUNT"), "0");
    // One machine: node 0 of 1.
    EXPECT_EQ(vars.at("XLA_SPAWN_NODE"), "0");
    EXPECT_EQ(vars.at("GROUP_RANK"), "0");
    EXPECT_EQ(vars.at("XLA_SPAWN_NNODES"), "1");
    EXPECT_EQ(vars.at("GROUP_WORLD_SIZE"), "1");
    // torch.distributed's env://: the same loopback store address for every replica.
    EXPECT_EQ(vars.at("MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(vars.at("MASTER_PORT"), env.at(0).at("MASTER_PORT"));
    EXPECT_GT(std::stoi(vars.at("MASTER_PORT")), 0) << vars.at("MASTER_PORT");
  }
  EXPECT_EQ(job_ids.size(), 1u) << "one job id per job";
}

// A job started inside a job (a replica running xla-spawn) gets a store of its own: sharing the
// outer job's MASTER_PORT, its ranks joined the other job's process group.
TEST(EnvTest, AJobInsideAJobGetsItsOwnTorchStorePort) {
  const RunResult r = run_xla_spawn({"-n", "1", "--", "/bin/sh", "-c",
                                     "echo OUTER $MASTER_PORT; exec " + xla_spawn_path() + " -n 2 -- " +
                                         helper_path() + " --do print-env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> outer = lines_with(r.out, "[0] OUTER ");
  ASSERT_EQ(outer.size(), 1u) << r.out;
  const std::string outer_port = outer[0].substr(std::string("[0] OUTER ").size());
  ASSERT_FALSE(outer_port.empty()) << r.out;
  EXPECT_EQ(r.out.find("ENV MASTER_PORT=" + outer_port + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[0] [1] ENV MASTER_PORT="), std::string::npos) << r.out;
}

TEST(EnvTest, UserSettingsOfTheTorchStoreAddressWin) {
  const RunResult r = run_xla_spawn({"-n", "1", "--", "/usr/bin/env", "MASTER_ADDR=198.18.0.9",
                                     "MASTER_PORT=29555", xla_spawn_path(), "-n", "2", "--",
                                     helper_path(), "--do", "print-env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[0] [1] ENV MASTER_ADDR=198.18.0.9"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[0] [1] ENV MASTER_PORT=29555"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, EnvTest, ::testing::Range(1, 9),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

TEST(EnvTest, MathLibrariesDefaultToOneThreadPerReplica) {
  const RunResult r = run_xla_spawn({"-n", "2", "--", "/usr/bin/env", "-u", "OMP_NUM_THREADS",
                                     "-u", "OPENBLAS_NUM_THREADS", xla_spawn_path(), "-n", "1",
                                     "--", helper_path(), "--do", "print-env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[0] [0] ENV OMP_NUM_THREADS=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[1] [0] ENV OPENBLAS_NUM_THREADS=1"), std::string::npos) << r.out;
}

// OpenBLAS under a hypervisor often misses the CPU and runs its SSE3 kernels: the launcher
// names the kernels the CPU can run.
TEST(EnvTest, OpenblasCoretypeDefaultsToTheKernelsTheCpuRuns) {
  const RunResult r = run_xla_spawn({"-n", "1", "--", "/usr/bin/env", "-u", "OPENBLAS_CORETYPE",
                                     xla_spawn_path(), "-n", "1", "--", helper_path(), "--do",
                                     "print-env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const std::string want = avx512 ? "SkylakeX" : avx2 ? "Haswell" : "<unset>";
  EXPECT_NE(r.out.find("[0] [0] ENV OPENBLAS_CORETYPE=" + want + "\n"), std::string::npos)
      << r.out;
}

// Replicas never read the terminal: their stdin is /dev/null.
TEST(EnvTest, ReplicasReadStdinFromDevNull) {
  const RunResult r =
      run_xla_spawn({"-n", "2", "--", "/bin/sh", "-c", "readlink /proc/self/fd/0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[0] /dev/null\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[1] /dev/null\n"), std::string::npos) << r.out;
}

TEST(EnvTest, UserSettingsOfMathLibrariesWin) {
  const RunResult r = run_xla_spawn({"-n", "1", "--", "/usr/bin/env", "OPENBLAS_NUM_THREADS=3",
                                     "OPENBLAS_CORETYPE=Prescott", xla_spawn_path(), "-n", "1",
                                     "--", helper_path(), "--do", "print-env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[0] [0] ENV OPENBLAS_NUM_THREADS=3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[0] [0] ENV OPENBLAS_CORETYPE=Prescott"), std::string::npos) << r.out;
}

TEST(EnvTest, JobIdDiffersBetweenJobs) {
  const RunResult a = run_xla_spawn({"-n", "1", "--", helper_path(), "--do", "print-env"});
  const RunResult b = run_xla_spawn({"-n", "1", "--", helper_path(), "--do", "print-env"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_NE(parse_env(a.out).at(0).at("XLA_SPAWN_JOB_ID"),
            parse_env(b.out).at(0).at("XLA_SPAWN_JOB_ID"));
}

TEST(EnvTest, OuterJobVariablesAreReplacedNotInherited) {
  // xla-spawn started from inside another job (a replica running xla-spawn).
  const RunResult r =
      run_xla_spawn({"-n", "2", "--", "/usr/bin/env", "XLA_SPAWN_ORDINAL=7",
                     "XLA_SPAWN_WORLD_SIZE=9", "XLA_SPAWN_SEGMENT=/outer", xla_spawn_path(), "-n",
                     "1", "--", helper_path(), "--do", "print-env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[0] [0] ENV XLA_SPAWN_WORLD_SIZE=1"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("ENV XLA_SPAWN_SEGMENT=/outer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[1] [0] ENV XLA_SPAWN_SEGMENT=/xla-spawn-"), std::string::npos) << r.out;
}

// "[k] CPUS a,b,..." of ordinal k.
std::string cpus_of(const RunResult& r, int k) {
  return lines_with(r.out, "[" + std::to_string(k) + "]").at(0);
}

TEST(EnvTest, BindingIsAutomaticOnlyWhenReplicasFitTheCpus) {
  const RunResult free_one = run_xla_spawn({"-n", "1", "--", helper_path(), "--do", "affinity"});
  const RunResult free_two =
      run_xla_spawn({"-n", "2", "--no-bind-cores", "--", helper_path(), "--do", "affinity"});
  const RunResult auto_two = run_xla_spawn({"-n", "2", "--", helper_path(), "--do", "affinity"});
  ASSERT_EQ(free_one.exit_code, 0) << free_one.err;
  ASSERT_EQ(free_two.exit_code, 0) << free_two.err;
  ASSERT_EQ(auto_two.exit_code, 0) << auto_two.err;
  const std::string all = cpus_of(free_one, 0).substr(4);  // "CPUS ..." for everything allowed
  EXPECT_EQ(cpus_of(free_two, 1).substr(4), all) << "--no-bind-cores must not pin";
  if (all.find(',') == std::string::npos) GTEST_SKIP() << "one CPU: nothing to bind to";
  EXPECT_EQ(cpus_of(auto_two, 0).find(','), std::string::npos) << auto_two.out;
  EXPECT_EQ(cpus_of(auto_two, 1).find(','), std::string::npos) << auto_two.out;
  EXPECT_NE(cpus_of(auto_two, 0).substr(4), cpus_of(auto_two, 1).substr(4)) << auto_two.out;
}

TEST(EnvTest, BindCoresPinsOrdinalToOneAllowedCpu) {
  const RunResult r =
      run_xla_spawn({"-n", "3", "--bind-cores", "--", helper_path(), "--do", "affinity"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const RunResult unpinned = run_xla_spawn({"-n", "1", "--", helper_path(), "--do", "affinity"});
  // "[0] CPUS 0,1" -> the allowed list; ordinal k must get list[k % size] alone.
  const std::string all = unpinned.out.substr(unpinned.out.find("CPUS ") + 5);
  std::vector<std::string> cpus;
  for (size_t start = 0; start < all.size();) {
    const size_t end = all.find_first_of(",\n", start);
    cpus.push_back(all.substr(start, end - start));
    start = end + 1;
    if (all[end] == '\n') break;
  }
  for (int k = 0; k < 3; ++k) {
    const std::string expected =
        "[" + std::to_string(k) + "] CPUS " + cpus[static_cast<size_t>(k) % cpus.size()];
    EXPECT_EQ(lines_with(r.out, "[" + std::to_string(k) + "]").at(0), expected) << r.out;
  }
}

}  // namespace
}  // namespace xs::testing
