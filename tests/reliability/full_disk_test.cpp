// A full disk under the debugging outputs: log files (--log-dir) and graph dumps
// (XLA_SPAWN_DUMP_GRAPHS) that stop fitting are said once and the job goes on; nothing is
// silently cut, nothing half-written is left. Each runs in a private mount namespace with a
// tiny tmpfs (root and util-linux's unshare; skipped without them).
#include <unistd.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/launcher/launch_support.h"
#include "tests/reliability/job_probe.h"

namespace xs::testing {
namespace {

// Runs `script` (sh) in a new mount namespace after mounting a tmpfs of `size` on `dir`.
// Returns nullopt (and skips) when that cannot be done here.
std::optional<Launch> in_small_tmpfs(const std::string& dir, const std::string& size,
                                     const std::string& script) {
  if (::geteuid() != 0) return std::nullopt;
  if (!std::filesystem::exists("/usr/bin/unshare")) return std::nullopt;
  const std::string job = "mount -t tmpfs -o size=" + size + " tmpfs " + dir + " && " + script;
  const std::vector<std::string> args{"/usr/bin/unshare", "-m", "/bin/sh", "-c", job};
  return std::optional<Launch>(std::in_place, args, true);
}

constexpr const char* kNeeds =
    "needs root and /usr/bin/unshare: mounts a small tmpfs in a private mount namespace";

TEST(FullDiskTest, ALogFileThatStopsFittingIsSaidAndTheJobGoesOn) {
  TempDir dir;
  const std::string mnt = dir / "mnt";
  std::filesystem::create_directory(mnt);
  std::optional<Launch> run = in_small_tmpfs(
      mnt, "8k",
      xla_spawn_path() + " -n 2 --log-dir " + mnt +
          "/logs -- /bin/sh -c 'for i in $(seq 3000); do echo line $RANK $i; done'");
  if (!run) GTEST_SKIP() << kNeeds;
  const int status = run->wait_or_fail(std::chrono::seconds(60));
  if (run->err().find("mount:") != std::string::npos) {
    GTEST_SKIP() << "cannot mount a tmpfs: " << run->err();
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << run->err();
  EXPECT_NE(run->err().find("cannot write log file " + mnt + "/logs/ordinal-"), std::string::npos)
      << run->err();
  EXPECT_NE(run->err().find("No space left on device"), std::string::npos) << run->err();
  EXPECT_NE(run->err().find("'s later lines are not in it"), std::string::npos) << run->err();
  // The console still has every line.
  EXPECT_EQ(lines_with(run->out(), "[0] line 0 ").size(), 3000u);
  EXPECT_EQ(lines_with(run->out(), "[1] line 1 ").size(), 3000u);
}

TEST(FullDiskTest, GraphDumpsThatStopFittingAreSaidAndTrainingGoesOn) {
  TempDir dir;
  const std::string mnt = dir / "mnt";
  std::filesystem::create_directory(mnt);
  // The training step's graph fits in 32 KiB; the evaluation's, compiled after epoch 1, not.
  std::optional<Launch> run = in_small_tmpfs(
      mnt, "32k",
      "XLA_SPAWN_DUMP_GRAPHS=" + mnt + "/g " + train_fmnist_path() +
          " --epochs 2 --train-samples 2048 --test-samples 512; echo \"exit $?\"; "
          "echo \"files $(find " + mnt + "/g -type f | wc -l)\"");
  if (!run) GTEST_SKIP() << kNeeds;
  const int status = run->wait_or_fail(std::chrono::seconds(120));
  if (run->err().find("mount:") != std::string::npos) {
    GTEST_SKIP() << "cannot mount a tmpfs: " << run->err();
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(run->out().find("exit 0\n"), std::string::npos) << run->out() << run->err();
  EXPECT_NE(run->err().find("XLA_SPAWN_DUMP_GRAPHS=" + mnt + "/g: writing " + mnt + "/g/graph_"),
            std::string::npos)
      << run->err();
  EXPECT_NE(run->err().find("dumping stops after 1 graph(s)"), std::string::npos) << run->err();
  // The training graph's two files, nothing of the evaluation's, no temporaries.
  EXPECT_NE(run->out().find("files 2\n"), std::string::npos) << run->out();
  EXPECT_NE(run->out().find("epoch 2"), std::string::npos) << run->out();
}

}  // namespace
}  // namespace xs::testing
