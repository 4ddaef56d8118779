// The debugging outputs under strain. A full disk: log files (--log-dir) and graph dumps
// (XLA_SPAWN_DUMP_GRAPHS) that stop fitting are said once and the job goes on; nothing is
// silently cut, nothing half-written is left (each in a private mount namespace with a tiny
// tmpfs: root and util-linux's unshare; skipped without them). Replicas dumping the same
// graphs into one directory at once.
#include <unistd.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/launcher/launch_support.h"
#include "tests/reliability/job_probe.h"

namespace xs::testing {
namespace {

struct SmallDiskRun {
  std::string skipped;  // why it could not run here; empty when it ran
  int status = 0;
  std::string out, err;
};

// Runs `script` (sh) in a new mount namespace after mounting a tmpfs of `size` on `dir`, for
// at most `limit`.
SmallDiskRun in_small_tmpfs(const std::string& dir, const std::string& size,
                            const std::string& script, std::chrono::seconds limit) {
  SmallDiskRun r;
  if (::geteuid() != 0 || !std::filesystem::exists("/usr/bin/unshare")) {
    r.skipped = "needs root and /usr/bin/unshare: mounts a small tmpfs in a private mount "
                "namespace";
    return r;
  }
  const std::string job = "mount -t tmpfs -o size=" + size + " tmpfs " + dir + " && " + script;
  Launch run({"/usr/bin/unshare", "-m", "/bin/sh", "-c", job}, true);
  r.status = run.wait_or_fail(limit);
  r.out = run.out();
  r.err = run.err();
  if (r.err.find("mount:") != std::string::npos) r.skipped = "cannot mount a tmpfs: " + r.err;
  return r;
}

TEST(FullDiskTest, ALogFileThatStopsFittingIsSaidAndTheJobGoesOn) {
  TempDir dir;
  const std::string mnt = dir / "mnt";
  std::filesystem::create_directory(mnt);
  const SmallDiskRun r = in_small_tmpfs(
      mnt, "8k",
      xla_spawn_path() + " -n 2 --log-dir " + mnt +
          "/logs -- /bin/sh -c 'for i in $(seq 3000); do echo line $RANK $i; done'",
      std::chrono::seconds(60));
  if (!r.skipped.empty()) GTEST_SKIP() << r.skipped;
  ASSERT_TRUE(WIFEXITED(r.status));
  EXPECT_EQ(WEXITSTATUS(r.status), 0) << r.err;
  EXPECT_NE(r.err.find("cannot write log file " + mnt + "/logs/ordinal-"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'s later lines are not in it"), std::string::npos) << r.err;
  // The console still has every line.
  EXPECT_EQ(lines_with(r.out, "[0] line 0 ").size(), 3000u);
  EXPECT_EQ(lines_with(r.out, "[1] line 1 ").size(), 3000u);
}

TEST(FullDiskTest, GraphDumpsThatStopFittingAreSaidAndTrainingGoesOn) {
  TempDir dir;
  const std::string mnt = dir / "mnt";
  std::filesystem::create_directory(mnt);
  // The training step's graph fits in 32 KiB; the evaluation's, compiled after epoch 1, not.
  const SmallDiskRun r = in_small_tmpfs(
      mnt, "32k",
      "XLA_SPAWN_DUMP_GRAPHS=" + mnt + "/g " + train_fmnist_path() +
          " --epochs 2 --train-samples 2048 --test-samples 512; echo \"exit $?\"; "
          "echo \"temporaries $(find " + mnt + "/g -name '*.tmp*' | wc -l)\"",
      std::chrono::seconds(120));
  if (!r.skipped.empty()) GTEST_SKIP() << r.skipped;
  ASSERT_TRUE(WIFEXITED(r.status));
  EXPECT_NE(r.out.find("exit 0\n"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.err.find("XLA_SPAWN_DUMP_GRAPHS=" + mnt + "/g: writing " + mnt + "/g/graph_"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("dumping stops after 1 graph(s)"), std::string::npos) << r.err;
  // No temporary left behind.
  EXPECT_NE(r.out.find("temporaries 0\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("epoch 2"), std::string::npos) << r.out;
}

// Every replica compiles, and dumps, the same graphs: each writes its own temporary, so none
// fails for another's rename, and every graph ends with both files.
TEST(DumpTest, ReplicasSharingTheDumpDirectoryAllSucceed) {
  TempDir dir;
  const std::string dumps = dir / "dumps";
  const RunResult r = run_xla_spawn(
      {"-n", "4", "--", "/usr/bin/env", "XLA_SPAWN_DUMP_GRAPHS=" + dumps, train_fmnist_path(),
       "--max-steps", "3", "--no-eval", "--train-samples", "500", "--epochs", "1"},
      std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("XLA_SPAWN_DUMP_GRAPHS"), std::string::npos) << r.err;
  size_t graphs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dumps)) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << name << " left behind";
    if (!name.ends_with(".txt")) continue;
    ++graphs;
    std::filesystem::path dot = entry.path();
    dot.replace_extension(".dot");
    EXPECT_TRUE(std::filesystem::exists(dot)) << dot;
  }
  EXPECT_GE(graphs, 1u);
}

}  // namespace
}  // namespace xs::testing
