// alias_views' gather pieces: the sharded update's all_gather writes the gathered parameters
// straight into their (donated) buffers instead of a flat buffer that slices then copy out.
// Every case compares against the same steps compiled without views.
#include <cstring>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/collective_ops.h"
#include "xla_spawn/runtime/compiler/compile.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/optim/adam.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

// Ordinal 0 of 2 in one process, the peer passing the same values: reduce_scatter keeps chunk
// 0 of the input, all_gather repeats the input. all_gather_pieces is Communicator's default.
class EchoCommunicator : public Communicator {
 public:
  int ordinal() const override { return 0; }
  int world_size() const override { return 2; }
  void all_reduce(void*, size_t, DType, ReduceOp) override {}
  void broadcast(void*, size_t, DType, int) override {}
  void all_gather(const void* in, void* out, size_t n_elems, DType dtype) override {
    const size_t bytes = n_elems * dtype_size(dtype);
    for (int k = 0; k < 2; ++k) std::memcpy(static_cast<std::byte*>(out) + k * bytes, in, bytes);
    ++gathers;
  }
  void reduce_scatter(const void* in, void* out, size_t n_elems, DType dtype, ReduceOp) override {
    std::memcpy(out, in, n_elems * dtype_size(dtype));
  }
  void barrier() override {}
  std::vector<std::vector<std::byte>> rendezvous(const std::string&,
                                                 std::span<const std::byte> mine) override {
    return {std::vector<std::byte>(mine.begin(), mine.end()),
            std::vector<std::byte>(mine.begin(), mine.end())};
  }
  int gathers = 0;
};

struct Result {
  std::vector<std::vector<float>> params;
  CompileStats stats;
  int gathers = 0;
};

// Three sharded Adam steps of a two-layer net (3 parameters, 35 + 5 + 15 elements: odd, so the
// flat buffer is padded at world size 2), over `world_size` 1 (no communicator) or 2.
Result sharded_steps(bool views, int world_size) {
  RuntimeOptions options;
  options.alias_views = views;
  EchoCommunicator comm;
  ScopedRuntime rt(options);
  if (world_size == 2) rt->set_communicator(&comm);
  Generator gen(3);
  Linear fc1(7, 5, gen), fc2(5, 3, gen, false);
  std::vector<Tensor> params = fc1.parameters();
  for (const Tensor& p : fc2.parameters()) params.push_back(p);
  Adam opt(params, {.lr = 0.01});
  for (int step = 0; step < 3; ++step) {
    const Tensor x = Tensor::from_vector<float>(std::vector<float>(4 * 7, 0.1f * (step + 1)), {4, 7});
    backward(sum(square(fc2(relu(fc1(x))))));
    {
      const std::vector<Tensor> grads = opt.gradients();
      opt.apply_sharded(grads, ReduceOp::kMean, world_size);
    }
    opt.zero_grad();
    mark_step();
  }
  Result r{{}, rt->last_stats(), comm.gathers};
  for (const Tensor& p : params) r.params.push_back(p.to_vector<float>());
  return r;
}

class GatherPieces : public ::testing::TestWithParam<int> {};

TEST_P(GatherPieces, ShardedUpdateGathersIntoTheParametersWithTheSameBits) {
  const Result with = sharded_steps(true, GetParam());
  const Result without = sharded_steps(false, GetParam());
  EXPECT_EQ(with.params, without.params);
  EXPECT_EQ(with.stats.gather_pieces, 3);  // fc1.weight, fc1.bias, fc2.weight
  EXPECT_EQ(without.stats.gather_pieces, 0);
  EXPECT_EQ(with.gathers, without.gathers);  // one collective per step either way
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GatherPieces, ::testing::Values(1, 2));

TEST(GatherPieces, GatheredValueReadOtherwiseIsStoredWhole) {
  auto step = [](bool views) {
    RuntimeOptions options;
    options.alias_views = views;
    ScopedRuntime rt(options);
    Tensor p = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {6});
    Tensor total;
    {
      const Tensor g = all_gather(exp(p * 0.5), 1);
      total = sum(g);  // a reader that is not a copy into other storage
      p.assign(slice(g, 0, 0, 6));
    }
    mark_step();
    return std::make_tuple(p.to_vector<float>(), total.to_vector<float>(),
                           rt->last_stats().gather_pieces);
  };
  const auto with = step(true), without = step(false);
  EXPECT_EQ(std::get<0>(with), std::get<0>(without));
  EXPECT_EQ(std::get<1>(with), std::get<1>(without));
  EXPECT_EQ(std::get<2>(with), 0);
}

TEST(GatherPieces, ProgramTextNamesThePiecesAndThePassIsIdempotent) {
  RuntimeOptions options;
  ScopedRuntime rt(options);
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::from_vector<float>({5, 6}, {2});
  {
    // Scoped: a gathered value still referenced at mark_step() is a step output of its own.
    const Tensor g = all_gather(concat({reshape(a, {4}) * 2.0, b + 1.0}, 0), 1);
    a.assign(reshape(slice(g, 0, 0, 4), {2, 2}));
    b.assign(slice(g, 0, 4, 6));
  }
  mark_step();
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{2, 4, 6, 8}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{6, 7}));
  auto program = rt->cache().find(rt->last_graph_hash());
  ASSERT_NE(program, nullptr);
  EXPECT_EQ(program->stats.gather_pieces, 2) << program->text();
  EXPECT_NE(program->text().find("all_gather(s"), std::string::npos) << program->text();
  EXPECT_NE(program->text().find(" into s"), std::string::npos) << program->text();
  alias_views(*program);
  EXPECT_EQ(program->stats.gather_pieces, 2);
}

}  // namespace
}  // namespace xs
