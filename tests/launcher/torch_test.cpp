// A PyTorch DDP script written for torchrun runs unchanged under xla-spawn: the launcher gives
// torch.distributed's env:// rendezvous its MASTER_ADDR and MASTER_PORT (tests/launcher/torch_ddp.py).
#include <sys/wait.h>

#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "tests/launcher/launch_support.h"

namespace xs::testing {
namespace {

// Debian's interpreter: python3-torch installs there, whatever python3 comes first in PATH.
constexpr const char* kPython = "/usr/bin/python3";

bool torch_available() {
  Launch probe({kPython, "-c", "import torch.distributed as d; assert d.is_gloo_available()"}, true);
  const std::optional<int> status = probe.wait_for(std::chrono::seconds(120));
  return status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
}

TEST(TorchTest, ADdpScriptTrainsWithGlooAndItsRanksAgree) {
  if (!torch_available()) GTEST_SKIP() << kPython << " cannot import torch with gloo (Debian python3-torch)";
  const RunResult r = run_xla_spawn({"-n", "2", "--", kPython, XS_TORCH_DDP_SCRIPT}, std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(lines_with(r.out, "[0] rank 0 of 2: 5 steps").size(), 1u) << r.out;
  EXPECT_EQ(lines_with(r.out, "[1] rank 1 of 2: 5 steps").size(), 1u) << r.out;
  EXPECT_NE(r.out.find("parameters agree"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace xs::testing
