// The sharded optimizer update (xm::optimizer_step with XLA_SPAWN_SHARDED_UPDATE, ZeRO stage
// 1) in real replica processes: the same bits as the all-reduce path, parameters identical on
// every replica, checkpoints holding the whole optimizer state, and resuming from them.

#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "xla_spawn/replica/checkpoint.h"
#include "xla_spawn/replica/optimizer_step.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/replica/xm_checkpoint.h"
#include "xla_spawn/replica/xm_collectives.h"
#include "xla_spawn/runtime/autocast.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/optim/adam.h"
#include "xla_spawn/runtime/optim/sgd.h"
#include "xla_spawn/runtime/runtime.h"
#include "xla_spawn/runtime/state_dict.h"
#include "tests/replica/replica_job.h"
#include "tests/replica/temp_dir.h"
#include "tests/support/scoped_env.h"

namespace xs {
namespace {

using testing::expect;
using testing::run_replicas;

// 13 247 parameters: not a multiple of 2, 3 or 4, so the flat buffer is padded.
struct Net {
  Generator gen{7};  // the same initial parameters on every replica
  Linear fc1{40, 301, gen};
  Linear fc2{301, 3, gen};
  std::vector<Tensor> params() const {
    std::vector<Tensor> p = fc1.parameters();
    for (const Tensor& t : fc2.parameters()) p.push_back(t);
    return p;
  }
  NamedTensors named() const {
    NamedTensors out;
    for (auto& [name, t] : fc1.named_state()) out.emplace_back("fc1." + name, t);
    for (auto& [name, t] : fc2.named_state()) out.emplace_back("fc2." + name, t);
    return out;
  }
  std::vector<float> values() const {
    std::vector<float> out;
    for (const Tensor& t : params()) {
      const std::vector<float> v = t.to_vector<float>();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }
};

// Steps [from, to): a batch that differs per ordinal and step, so the gradients do too.
void train(Net& net, Optimizer& opt, int from, int to) {
  for (int s = from; s < to; ++s) {
    std::vector<float> x(4 * 40);
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = std::sin(0.7f * xm::ordinal() + 0.3f * s + 0.11f * i);
    backward(sum(square(net.fc2(relu(net.fc1(Tensor::from_vector<float>(x, {4, 40})))))));
    xm::optimizer_step(opt);
  }
}

// The same under autocast (fc1 in bf16, fc2 left in f32; f32 master weights); `options`
// chooses the gradients' exchange dtype.
void train_autocast(Net& net, Optimizer& opt, int steps, const xm::StepOptions& options) {
  for (int s = 0; s < steps; ++s) {
    std::vector<float> x(4 * 40);
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = std::sin(0.7f * xm::ordinal() + 0.3f * s + 0.11f * i);
    Tensor loss;
    {
      AutocastGuard bf16(DType::kBF16);
      const Tensor h = relu(net.fc1(Tensor::from_vector<float>(x, {4, 40})));
      AutocastGuard f32(DType::kF32);  // fc2 in f32: its gradients are not casts of bf16 ones
      loss = sum(square(net.fc2(cast(h, DType::kF32))));
    }
    backward(loss);
    xm::optimizer_step(opt, net.named(), options);
  }
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

bool same_state(const StateDict& a, const StateDict& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].shape != b[i].shape || a[i].bytes != b[i].bytes)
      return false;
  }
  return true;
}

std::unique_ptr<Optimizer> make(const std::string& kind, const Net& net) {
  if (kind == "sgd") {
    return std::make_unique<SGD>(net.params(),
                                 SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01});
  }
  return std::make_unique<Adam>(net.params(), AdamOptions{.lr = 0.01, .weight_decay = 0.01});
}

// A per-tensor update (each gradient scaled to unit norm, as LAMB's trust ratio is per
// tensor): run on chunks that cut across parameters it would take the norms of the chunks.
class NormalizedSgd : public Optimizer {
 public:
  NormalizedSgd(std::vector<Tensor> params, double lr) : Optimizer(std::move(params), lr) {
    init_state();
  }

 protected:
  void update(Tensor& param, const Tensor& grad, std::vector<Tensor>&) override {
    param.assign(param - grad * rsqrt(sum(square(grad)) + 1e-12) * lr_tensor());
  }
  std::vector<std::string> state_names() const override { return {}; }
};

class ShardedUpdate : public ::testing::TestWithParam<int> {};

TEST_P(ShardedUpdate, LeavesAnUpdateNotDeclaredElementwiseWholeWithTheSameBits) {
  const int n = GetParam();
  const auto job = run_replicas(n, [](int) {
    std::vector<float> whole, asked_to_shard;
    for (const char* sharded : {"0", "1"}) {
      testing::ScopedEnv env(xm::kShardedUpdateEnv, sharded);
      Net net;
      NormalizedSgd opt(net.params(), 0.05);
      train(net, opt, 0, 4);
      expect(opt.shard_world_size() == 0, "a per-tensor update is never sharded");
      (sharded[0] == '0' ? whole : asked_to_shard) = net.values();
    }
    expect(same_bits(whole, asked_to_shard),
           "XLA_SPAWN_SHARDED_UPDATE=1 gives the all-reduce path's parameters");
  });
  EXPECT_EQ(job.result.exit_code, 0) << job.result.summary;
}

// Autocast's gradients cross replicas in bf16 (sharded or not, the same bits), fc2's f32 ones
// rounded with them, which rounds them: close to the f32 exchange's parameters but not the
// same; every replica agrees.
TEST_P(ShardedUpdate, AutocastGradientsCrossInBF16WhetherShardedOrNot) {
  const int n = GetParam();
  const auto job = run_replicas(n, [n](int) {
    std::vector<float> whole, sharded, f32_exchange;
    for (const char* mode : {"whole", "sharded", "f32"}) {
      testing::ScopedEnv env(xm::kShardedUpdateEnv, mode[0] == 'w' ? "0" : "1");
      Net net;
      auto opt = make("sgd", net);  // Adam's normalised step would flip on a rounded tiny gradient
      train_autocast(net, *opt, 4, xm::StepOptions{.bf16_exchange = mode[0] != 'f'});
      expect(opt->shard_world_size() == (mode[0] == 'w' ? 0 : n), std::string(mode) + ": sharding");
      for (const Tensor& p : net.params()) expect(p.dtype() == DType::kF32, "master weights f32");
      (mode[0] == 'w' ? whole : mode[0] == 's' ? sharded : f32_exchange) = net.values();
    }
    expect(same_bits(whole, sharded), "bf16 exchange: sharded parameters == all-reduce parameters");
    expect(!same_bits(sharded, f32_exchange), "the bf16 exchange rounds the gradients");
    // Each exchanged gradient rounded once (2^-9 relative) against parameters that moved by
    // `moved` from the same start: the difference is a small fraction of the movement.
    Net start;
    const std::vector<float> initial = start.values();
    double worst = 0, moved = 0;
    for (size_t i = 0; i < sharded.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(sharded[i] - f32_exchange[i])));
      moved = std::max(moved, static_cast<double>(std::abs(f32_exchange[i] - initial[i])));
    }
    expect(worst > 0 && worst < 0.02 * moved, "bf16 and f32 exchange stay close: " +
                                                  std::to_string(worst) + " of " +
                                                  std::to_string(moved));
    const auto all =
        xm::rendezvous("params", std::as_bytes(std::span<const float>(sharded.data(), 64)));
    for (const auto& peer : all) expect(peer == all[0], "every replica holds the same bits");
  });
  EXPECT_EQ(job.result.exit_code, 0) << job.result.summary;
}

TEST_P(ShardedUpdate, GivesTheSameBitsAsTheAllReduceOnEveryReplica) {
  const int n = GetParam();
  const auto job = run_replicas(n, [n](int) {
    for (const std::string kind : {"adam", "sgd"}) {
      std::vector<float> whole, sharded;
      StateDict whole_state, sharded_state;
      {
        testing::ScopedEnv off(xm::kShardedUpdateEnv, "0");
        Net net;
        auto opt = make(kind, net);
        train(net, *opt, 0, 5);
        expect(opt->shard_world_size() == 0,
               kind + ": XLA_SPAWN_SHARDED_UPDATE=0 keeps the state whole");
        whole = net.values();
        whole_state = to_state_dict(opt->named_state());
      }
      {
        testing::ScopedEnv on(xm::kShardedUpdateEnv, "1");
        Net net;
        auto opt = make(kind, net);
        train(net, *opt, 0, 5);
        expect(opt->shard_world_size() == n, kind + ": state sharded over every replica");
        sharded = net.values();
        sharded_state = to_state_dict(opt->named_state());  // gathered: collective
      }
      expect(same_bits(whole, sharded), kind + ": sharded parameters == all-reduce parameters");
      expect(same_state(whole_state, sharded_state), kind + ": gathered state == whole state");
      const auto all =
          xm::rendezvous("params", std::as_bytes(std::span<const float>(sharded.data(), 64)));
      for (const auto& peer : all)
        expect(peer == all[0], kind + ": every replica holds the same bits");
    }
  });
  EXPECT_EQ(job.result.exit_code, 0) << job.result.summary;
}

// AdamW that decays only matrices (its decay mask is a state buffer, cut into chunks like the
// moments) and, with max_norm > 0, the in-graph clipping by global norm; the step's norms.
std::vector<float> train_adamw(Net& net, Optimizer& opt, double max_norm) {
  NamedTensors named;
  for (const Tensor& p : net.params()) named.emplace_back("p", p);
  std::vector<float> norms;
  for (int s = 0; s < 5; ++s) {
    std::vector<float> x(4 * 40);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * xm::ordinal() + 0.3f * s + 0.11f * i);
    backward(sum(square(net.fc2(relu(net.fc1(Tensor::from_vector<float>(x, {4, 40})))))));
    const Tensor norm = xm::optimizer_step(opt, named, {.clip_grad_norm = max_norm});
    if (norm.defined()) norms.push_back(norm.item());
  }
  return norms;
}

TEST_P(ShardedUpdate, DecaysOnlyMatricesAndClipsByTheGlobalNormAsTheAllReducePathDoes) {
  const int n = GetParam();
  const auto job = run_replicas(n, [n](int) {
    for (const double max_norm : {0.0, 0.01}) {
      std::vector<float> values[2], norms[2];
      for (int sharded = 0; sharded < 2; ++sharded) {
        testing::ScopedEnv env(xm::kShardedUpdateEnv, sharded ? "1" : "0");
        Net net;
        const std::vector<Tensor> params = net.params();
        AdamW opt(params, {.lr = 0.01, .weight_decay = 0.5}, decay_matrices_only(params));
        norms[sharded] = train_adamw(net, opt, max_norm);
        expect(opt.shard_world_size() == (sharded ? n : 0), "sharded only when asked");
        values[sharded] = net.values();
      }
      if (max_norm == 0) {
        expect(same_bits(values[0], values[1]), "decay mask: sharded parameters == all-reduce parameters");
        continue;
      }
      // The squares are summed in another order (chunks, then across replicas): close, not equal.
      expect(norms[0].size() == 5 && norms[1].size() == 5, "a norm per step on both paths");
      for (size_t i = 0; i < 5; ++i) {
        expect(norms[0][i] > 0.01f, "the gradients are above the clip, so clipping acts");
        expect(std::abs(norms[1][i] / norms[0][i] - 1) < 1e-5, "the same global norm on both paths");
      }
      for (size_t i = 0; i < values[0].size(); ++i) {
        expect(std::abs(values[1][i] - values[0][i]) <= 1e-5f * (1 + std::abs(values[0][i])),
               "clipped sharded parameters == clipped all-reduce parameters");
      }
    }
  });
  EXPECT_EQ(job.result.exit_code, 0) << job.result.summary;
}

TEST_P(ShardedUpdate, CheckpointHoldsTheWholeStateAndResumesToTheSameBits) {
  const int n = GetParam();
  testing::TempDir dir;
  const std::string path = dir.path("ck");
  const auto job = run_replicas(n, [n, &path](int) {
    Net a;
    Adam opt_a(a.params(), {.lr = 0.01});
    train(a, opt_a, 0, 3);
    expect(opt_a.shard_world_size() == n, "sharded");
    xm::save(path, a.named(), &opt_a, {{"step", int64_t{3}}});
    train(a, opt_a, 3, 6);
    const std::vector<float> uninterrupted = a.values();
    StateDict reference;
    {
      testing::ScopedEnv off(xm::kShardedUpdateEnv, "0");
      Net r;
      Adam opt_r(r.params(), {.lr = 0.01});
      train(r, opt_r, 0, 3);
      reference = to_state_dict(opt_r.named_state());
    }
    StateDict saved;
    for (const HostTensor& t : load_checkpoint(path).tensors) {
      if (t.name.starts_with("optim."))
        saved.push_back({t.name.substr(6), t.dtype, t.shape, t.bytes});
    }
    expect(same_state(saved, reference), "the checkpoint holds the whole, unsharded state");
    // Resume into a fresh optimizer (whole state, sharded at its first step) ...
    Net b;
    Adam opt_b(b.params(), {.lr = 0.01});
    xm::load(path, b.named(), &opt_b);
    train(b, opt_b, 3, 6);
    expect(same_bits(b.values(), uninterrupted), "resumed fresh == uninterrupted");
    // ... and into one whose state is sharded already.
    Net c;
    Adam opt_c(c.params(), {.lr = 0.01});
    train(c, opt_c, 0, 1);
    xm::load(path, c.named(), &opt_c);
    train(c, opt_c, 3, 6);
    expect(same_bits(c.values(), uninterrupted), "resumed into sharded state == uninterrupted");
  });
  EXPECT_EQ(job.result.exit_code, 0) << job.result.summary;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedUpdate, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

}  // namespace
}  // namespace xs
