// A /dev/shm too small for the buffer arenas (Docker's default is 64 MiB): the arena is sparse,
// so its pages are backed only when written, and a full /dev/shm used to kill a replica with
// SIGBUS mid-run. Buffers /dev/shm cannot back now come from the heap, with a warning naming
// /dev/shm, and the job finishes. Runs in a private mount namespace with a 20 MiB tmpfs on
// /dev/shm (root and util-linux's unshare; skipped without them).
#include <unistd.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "tests/launcher/launch_support.h"
#include "tests/reliability/job_probe.h"

namespace xs::testing {
namespace {

TEST(ShmFullTest, ADevShmTooSmallForTheArenasSlowsTheJobInsteadOfKillingIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: mounts a small tmpfs on /dev/shm in a private mount namespace";
  if (!std::filesystem::exists("/usr/bin/unshare")) GTEST_SKIP() << "needs /usr/bin/unshare (util-linux)";
  const std::string job = "mount -t tmpfs -o size=20m tmpfs /dev/shm && exec " + xla_spawn_path() +
                          " -n 4 -- " + train_fmnist_path() + " --train-samples 2000 --no-eval --epochs 1";
  Launch run({"/usr/bin/unshare", "-m", "/bin/sh", "-c", job}, true);
  const int status = run.wait_or_fail(std::chrono::seconds(120));
  if (run.err().find("mount:") != std::string::npos) GTEST_SKIP() << "cannot mount a tmpfs here: " << run.err();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << run.err();
  EXPECT_EQ(run.err().find("SIGBUS"), std::string::npos) << run.err();
  EXPECT_NE((run.out() + run.err()).find("/dev/shm cannot back a"), std::string::npos) << "the fallback is said\n" << run.err();
  EXPECT_NE(run.out().find("[0] done: 16 steps"), std::string::npos) << run.out();
}

}  // namespace
}  // namespace xs::testing
