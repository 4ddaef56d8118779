// The replica API in real replica processes (spawn(fn) forks them with a real segment):
// host and in-graph collectives, the master's parameters broadcast at start, and the debug
// mode naming the ordinal that diverged. Checkpoint fit checks run standalone.

#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/launcher/spawn.h"
#include "xla_spawn/replica/device_loader.h"
#include "xla_spawn/replica/divergence_check.h"
#include "xla_spawn/replica/optimizer_step.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/replica/xm_checkpoint.h"
#include "xla_spawn/replica/xm_collectives.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/optim/sgd.h"
#include "xla_spawn/runtime/runtime.h"
#include "tests/replica/replica_job.h"
#include "tests/replica/temp_dir.h"
#include "tests/support/scoped_env.h"

namespace xs {
namespace {

using testing::expect;
using Job = testing::ReplicaJob;
using testing::run_replicas;

class XmCollectives : public ::testing::TestWithParam<int> {};

TEST_P(XmCollectives, HostCollectivesAndMeshReduceCombineEveryOrdinal) {
  const int n = GetParam();
  const Job job = run_replicas(n, [n](int ordinal) {
    expect(xm::ordinal() == ordinal && xm::world_size() == n, "identity");
    std::vector<double> v{double(ordinal), 1.0};
    xm::all_reduce(std::span<double>(v), ReduceOp::kSum);
    expect(v[0] == n * (n - 1) / 2.0 && v[1] == n, "all_reduce sum");
    const std::vector<double> g = xm::all_gather(std::vector<double>{double(ordinal) * 10});
    for (int k = 0; k < n; ++k) expect(g[k] == k * 10, "all_gather slot " + std::to_string(k));
    std::vector<double> chunks(n, double(ordinal + 1));
    expect(xm::reduce_scatter(chunks, ReduceOp::kSum) == std::vector<double>{n * (n + 1) / 2.0},
           "reduce_scatter");
    expect(xm::mesh_reduce("max", ordinal, ReduceOp::kMax) == n - 1, "mesh_reduce max");
    expect(xm::mesh_reduce("mean", ordinal, ReduceOp::kMean) == (n - 1) / 2.0, "mesh_reduce mean");
  });
  EXPECT_EQ(job.result.exit_code, 0) << job.result.summary;
}

// max and min keep a NaN from any ordinal (as all_reduce's do); replicas reducing with
// different ops, or meeting a rendezvous under the same tag, all fail.
TEST_P(XmCollectives, MeshReduceKeepsANanFromAnyOrdinalAndRefusesDifferentOps) {
  const int n = GetParam();
  const Job job = run_replicas(n, [n](int ordinal) {
    const double v = ordinal == n - 1 ? NAN : ordinal;
    expect(std::isnan(xm::mesh_reduce("nan max", v, ReduceOp::kMax)), "max keeps the NaN");
    expect(std::isnan(xm::mesh_reduce("nan min", v, ReduceOp::kMin)), "min keeps the NaN");
    if (n == 1) return;  // one replica: no other op to disagree with
    try {
      xm::mesh_reduce("ops", 1.0, ordinal == 0 ? ReduceOp::kSum : ReduceOp::kMax);
      throw std::runtime_error("different ops were not refused");
    } catch (const PeerFailure& e) {
      expect(std::string(e.what()).find("mesh_reduce 'ops': ordinal ") != std::string::npos,
             e.what());
    }
  });
  EXPECT_EQ(job.result.exit_code, 0) << job.result.summary;
  if (n == 1) return;
  // No side returns: before, the rendezvous side went on with a payload it misread.
  const Job paired = run_replicas(n, [](int ordinal) {
    if (ordinal == 0) {
      xm::mesh_reduce("same tag", 1.0, ReduceOp::kSum);
    } else {
      const double one = 1.0;
      xm::rendezvous("same tag", std::as_bytes(std::span<const double>(&one, 1)));
    }
    fmt::print("returned\n");
    std::fflush(stdout);
  });
  EXPECT_NE(paired.result.exit_code, 0);
  for (const auto& [k, text] : paired.output) {
    EXPECT_EQ(text.find("returned"), std::string::npos) << "ordinal " << k << ": " << text;
  }
}

TEST_P(XmCollectives, InGraphAllReduceOfManyTensorsGivesTheMeanOfEach) {
  const int n = GetParam();
  const Job job = run_replicas(n, [n](int ordinal) {
    // Shapes of different ranks and sizes, one f64: two flat buffers (one per dtype).
    std::vector<Tensor> ts{Tensor::full_data({3, 2}, ordinal + 1.0),
                           Tensor::full_data({5}, 2.0 * ordinal),
                           Tensor::full_data({2}, ordinal, DType::kF64), Tensor{}};
    const std::vector<Tensor> r = xm::all_reduce(ts, ReduceOp::kMean);
    mark_step();
    expect(!r[3].defined(), "undefined stays undefined");
    expect(r[0].shape() == Shape{3, 2} && r[1].shape() == Shape{5}, "shapes kept");
    for (float v : r[0].to_vector<float>()) expect(v == (n + 1) / 2.0f, "mean of ordinal+1");
    for (float v : r[1].to_vector<float>()) expect(v == float(n - 1), "mean of 2*ordinal");
    for (double v : r[2].to_vector<double>()) expect(v == (n - 1) / 2.0, "f64 mean");
  });
  EXPECT_EQ(job.result.exit_code, 0) << job.result.summary;
}

TEST_P(XmCollectives, ReplicasStartFromTheMastersParameters) {
  const Job job = run_replicas(GetParam(), [](int ordinal) {
    Generator gen(100 + ordinal);  // every ordinal initialises differently
    Linear fc(4, 3, gen);
    xm::broadcast_parameters(fc.named_state());
    Generator master_gen(100);
    Linear master(4, 3, master_gen);
    expect(fc.weight().to_vector<float>() == master.weight().to_vector<float>(),
           "weight is the master's");
    expect(fc.bias()->to_vector<float>() == master.bias()->to_vector<float>(),
           "bias is the master's");
  });
  EXPECT_EQ(job.result.exit_code, 0) << job.result.summary;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, XmCollectives, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

// SGD steps of a small linear model on the same data everywhere; `perturb_ordinal` nudges its
// bias before step `perturb_step` (-1: never).
void train_steps(Linear& fc, SGD& opt, int steps, int perturb_ordinal, int perturb_step) {
  const Tensor x = Tensor::full_data({2, 4}, 0.5);
  for (int s = 1; s <= steps; ++s) {
    if (xm::ordinal() == perturb_ordinal && s == perturb_step) {
      NoGradGuard g;
      fc.bias()->assign(*fc.bias() + 1e-3);
      mark_step();  // its own graph (no collective), so the step's graph stays the same
    }
    backward(sum(square(fc(x))));
    xm::optimizer_step(opt);
  }
}

TEST(XmDebugReplicas, DivergedOrdinalIsNamedWithTheStepAndParameter) {
  testing::ScopedEnv debug(xm::kDebugReplicasEnv, "1");
  // The all-reduce path: the sharded update's all-gather would hand every replica the owner's
  // value of the nudged bias, so the replicas would agree again.
  testing::ScopedEnv unsharded(xm::kShardedUpdateEnv, "0");
  const Job job = run_replicas(3, [](int) {
    Generator gen(1);
    Linear fc(4, 3, gen);
    SGD opt(fc.parameters(), {.lr = 0.1});
    train_steps(fc, opt, 4, /*perturb_ordinal=*/2, /*perturb_step=*/3);
  });
  EXPECT_NE(job.result.exit_code, 0);
  // Every ordinal finds the divergence; whichever throws first stops the others.
  std::string all;
  for (const auto& [ordinal, text] : job.output) all += text;
  EXPECT_NE(all.find("replicas diverged at step 3: ordinal 2 parameter 'param 1'"),
            std::string::npos)
      << all;
}

TEST(XmDebugReplicas, IdenticalReplicasPassEveryStep) {
  testing::ScopedEnv debug(xm::kDebugReplicasEnv, "1");
  const Job job = run_replicas(2, [](int) {
    Generator gen(1);
    Linear fc(4, 3, gen);
    SGD opt(fc.parameters(), {.lr = 0.1, .momentum = 0.9});
    train_steps(fc, opt, 4, -1, -1);
  });
  EXPECT_EQ(job.result.exit_code, 0) << job.result.summary;
}

// The runtime checks the graph hash across replicas only when a replica's graph changes; a
// replica that changes its step alone must still get an error, not a mixed-up all-reduce.
TEST(XmGraphCheck, ReplicaWhoseStepChangesAloneFailsClearly) {
  const Job job = run_replicas(2, [](int ordinal) {
    for (int step = 0; step < 4; ++step) {
      // Ordinal 1 adds an op from step 2 on: a different graph, the same all-reduce size.
      Tensor g = Tensor::full_data({64}, 1.0);
      if (ordinal == 1 && step >= 2) g = exp(g);
      const std::vector<Tensor> r = xm::all_reduce(std::vector<Tensor>{g * 2.0}, ReduceOp::kSum);
      mark_step();
    }
  });
  EXPECT_NE(job.result.exit_code, 0);
  std::string all;
  for (const auto& [ordinal, text] : job.output) all += text;
  EXPECT_NE(all.find("mismatched collective calls"), std::string::npos) << all;
  EXPECT_NE(all.find("graph"), std::string::npos) << all;
}

TEST(XmGraphCheck, RepeatedStepsRendezvousOnceAndAgree) {
  const Job job = run_replicas(3, [](int) {
    for (int step = 0; step < 5; ++step) {
      const std::vector<Tensor> r =
          xm::all_reduce(std::vector<Tensor>{Tensor::full_data({8}, 1.0) * 2.0}, ReduceOp::kSum);
      mark_step();
      for (float v : r[0].to_vector<float>()) expect(v == 6.0f, "sum of 2 over 3 replicas");
    }
    expect(runtime().metrics().counter(kCounterGraphHashCheck) == 1, "one graph-hash check");
  });
  EXPECT_EQ(job.result.exit_code, 0) << job.result.summary;
}

// A program that calls init() before spawn(fn), as one written for xla-spawn does first: its
// children inherited the parent's world of one, and init() kept it (it is idempotent), so
// every child ran alone and its collectives did nothing, silently.
TEST(XmInit, AParentsInitIsNotTheChildrensAfterSpawn) {
  xm::shutdown();
  xm::init();
  ASSERT_EQ(xm::world_size(), 1);
  SpawnOptions options;
  options.grace = std::chrono::milliseconds(500);
  const JobResult r = spawn(
      [](int ordinal) {
        xm::init();
        expect(xm::ordinal() == ordinal && xm::world_size() == 2,
               fmt::format("ordinal {} of {} in child {}", xm::ordinal(), xm::world_size(), ordinal));
        std::vector<double> v{1.0};
        xm::all_reduce(std::span<double>(v), ReduceOp::kSum);
        expect(v[0] == 2.0, fmt::format("sum {} over 2 replicas", v[0]));
        xm::init();  // idempotent again in the child's own state
        expect(xm::world_size() == 2, "a second init keeps the child's state");
      },
      2, options);
  EXPECT_EQ(r.exit_code, 0) << r.summary;
  EXPECT_EQ(xm::world_size(), 1);  // the parent's own state is untouched
  xm::shutdown();
}

TEST(XmCheckpoint, ModelOfOtherShapesIsRefusedAndLeftUnchanged) {
  xm::shutdown();
  xm::init();
  testing::TempDir dir;
  Generator gen(1);
  Linear saved(4, 3, gen);
  SGD opt(saved.parameters(), {.lr = 0.1, .momentum = 0.9});
  xm::save(dir.path("ck"), saved.named_state(), &opt, {{"epoch", int64_t{2}}});
  Linear other(4, 2, gen);
  const std::vector<float> before = other.weight().to_vector<float>();
  try {
    xm::load(dir.path("ck"), other.named_state(), nullptr);
    ADD_FAILURE() << "a checkpoint of [3, 4] weights loaded into a [2, 4] model";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "entry 0 is 'model.weight' f32 3x4, expected 'model.weight' f32 2x4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(other.weight().to_vector<float>(), before);
  // The same file fits a model of the right shapes, optimizer state included.
  Linear same(4, 3, gen);
  SGD same_opt(same.parameters(), {.lr = 0.1, .momentum = 0.9});
  EXPECT_EQ(std::get<int64_t>(xm::load(dir.path("ck"), same.named_state(), &same_opt).at("epoch")),
            2);
  EXPECT_EQ(same.weight().to_vector<float>(), saved.weight().to_vector<float>());
  xm::shutdown();
}

TEST(XmCheckpoint, TruncatedFileIsRejectedNamingTheFile) {
  xm::shutdown();
  xm::init();
  testing::TempDir dir;
  Generator gen(1);
  Linear fc(4, 3, gen);
  xm::save(dir.path("ck"), fc.named_state(), nullptr, {});
  std::vector<uint8_t> bytes = testing::TempDir::read(dir.path("ck"));
  bytes.resize(bytes.size() - 7);
  dir.write("short", bytes);
  EXPECT_THROW(
      {
        try {
          xm::load(dir.path("short"), fc.named_state(), nullptr);
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find(dir.path("short")), std::string::npos) << e.what();
          throw;
        }
      },
      InvalidArgument);
  xm::shutdown();
}

TEST(DeviceLoader, GlobalValidCountCoversThePaddedTail) {
  // 100 samples, global batch 32: steps of 32, 32, 32 and a tail of 4.
  EXPECT_EQ(xm::global_valid_samples(100, 32, 0, true), 32);
  EXPECT_EQ(xm::global_valid_samples(100, 32, 3, true), 4);
  EXPECT_EQ(xm::global_valid_samples(100, 32, 3, false), 32);
  EXPECT_EQ(xm::global_valid_samples(96, 32, 2, true), 32);
}

}  // namespace
}  // namespace xs
