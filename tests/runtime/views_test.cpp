// alias_views: the flatten / all-reduce / unflatten of gradients runs without the concat and
// slice copies, and a slice stays a copy when its source changes while it is read. Every case
// compares against the same graph compiled without views.
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/runtime/compiler/compile.h"
#include "xla_spawn/runtime/flatten.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

// World size 2 in one process, the peer holding the same values: all_reduce(kSum) doubles
// f32 data in place, so a view that reads the buffer after the reduction sees the change.
class DoublingCommunicator : public Communicator {
 public:
  int ordinal() const override { return 0; }
  int world_size() const override { return 2; }
  void all_reduce(void* data, size_t n_elems, DType dtype, ReduceOp) override {
    ASSERT_EQ(dtype, DType::kF32);
    auto* f = static_cast<float*>(data);
    for (size_t i = 0; i < n_elems; ++i) f[i] *= 2;
  }
  void broadcast(void*, size_t, DType, int) override {}
  void all_gather(const void*, void*, size_t, DType) override {}
  void reduce_scatter(const void*, void*, size_t, DType, ReduceOp) override {}
  void barrier() override {}
  void* alloc_buffer(size_t bytes) override {
    ++allocs;
    return Communicator::alloc_buffer(bytes);
  }
  void free_buffer(void* data) override {
    ++frees;
    Communicator::free_buffer(data);
  }
  int allocs = 0, frees = 0;
  std::vector<std::vector<std::byte>> rendezvous(const std::string&,
                                                 std::span<const std::byte> mine) override {
    return {std::vector<std::byte>(mine.begin(), mine.end()),
            std::vector<std::byte>(mine.begin(), mine.end())};
  }
};

struct StepResult {
  std::vector<std::vector<float>> values;
  CompileStats stats;
};

// Runs `build` (which returns the tensors to read) in a fresh runtime, with or without views.
template <typename Build>
StepResult run_step(bool views, Build build) {
  RuntimeOptions options;
  options.alias_views = views;
  // Declared first: the runtime returns its all-reduce buffers to it when destroyed.
  DoublingCommunicator comm;
  ScopedRuntime rt(options);
  rt->set_communicator(&comm);
  const std::vector<Tensor> outs = build();
  mark_step();
  StepResult r{{}, rt->last_stats()};
  for (const Tensor& t : outs) r.values.push_back(t.to_vector<float>());
  return r;
}

std::vector<Tensor> gradient_like_step() {
  const Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = Tensor::from_vector<float>({1, -1, 2, 0.5f, 0, 3}, {3, 2});
  // Operands of every producer kind: a GEMM, a reduction, a fused loop.
  const std::vector<Tensor> grads{matmul(a, b), sum(a, {0}), exp(b) * 2.0};
  const std::vector<Tensor> reduced =
      unflatten_tensors(all_reduce(flatten_tensors(grads), ReduceOp::kSum), grads);
  std::vector<Tensor> updated;
  for (const Tensor& g : reduced) updated.push_back(g * 0.5 + 1.0);
  return updated;
}

TEST(AliasViews, FlattenAllReduceUnflattenRunsWithoutCopies) {
  const StepResult with = run_step(true, gradient_like_step);
  const StepResult without = run_step(false, gradient_like_step);
  EXPECT_EQ(with.values, without.values);
  EXPECT_EQ(with.stats.views, 4);  // the concat and three slices
  EXPECT_EQ(with.stats.kernels, without.stats.kernels - 4);
  EXPECT_EQ(without.stats.views, 0);
  // Column sum of a (1 + 4), doubled by the all-reduce, halved by the update, plus 1.
  EXPECT_FLOAT_EQ(with.values[1][0], 1 + 4 + 1);
}

TEST(AliasViews, SliceOfABufferChangedWhileItIsReadStaysACopy) {
  auto step = [] {
    const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {8});
    const Tensor t = exp(x * 0.1);
    const Tensor s = slice(t, 0, 2, 6);
    const Tensor r = all_reduce(t, ReduceOp::kSum);  // in place over t's buffer
    return std::vector<Tensor>{r, s * 3.0};
  };
  const StepResult with = run_step(true, step);
  const StepResult without = run_step(false, step);
  EXPECT_EQ(with.values, without.values);
  EXPECT_FLOAT_EQ(with.values[1][0], 3 * std::exp(0.3f));  // the slice before the reduction
}

// The slot of a slice's value is reused by a matmul whose epilogue reads the matmul's result
// from it: that read is of the new value, not of the slice (once made a view of the slice).
TEST(AliasViews, AGemmEpilogueInTheSlicesSlotReadsItsOwnResult) {
  auto seq = [](int64_t n, float scale) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7) % 11 - 5) * scale;
    return v;
  };
  auto step = [&] {
    const Tensor x = Tensor::from_vector<float>(seq(24, 0.5f), {4, 6});
    const Tensor a = Tensor::from_vector<float>(seq(16, 0.25f), {4, 4});
    const Tensor b = Tensor::from_vector<float>(seq(24, 0.125f), {4, 6});
    const Tensor w = Tensor::from_vector<float>(seq(24, 1.0f), {6, 4});
    const Tensor head = relu(slice(x, 0, 0, 2) - 0.25);
    const Tensor out = matmul(matmul(a, b) + x, w);
    return std::vector<Tensor>{head, out};
  };
  const StepResult with = run_step(true, step);
  const StepResult without = run_step(false, step);
  EXPECT_EQ(with.values, without.values);
}

TEST(AliasViews, ConcatWhoseOperandIsReadAgainStaysACopy) {
  auto step = [] {
    const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4}, {4});
    const Tensor g = exp(x);
    const Tensor flat = all_reduce(concat({g, x * 2.0}, 0), ReduceOp::kSum);
    // g is read after the in-place reduction (by a loop that also reads its result, so it
    // cannot be computed where g is, as a sum of g would be).
    return std::vector<Tensor>{flat, g * sum(flat)};
  };
  const StepResult with = run_step(true, step);
  const StepResult without = run_step(false, step);
  EXPECT_EQ(with.values, without.values);
  EXPECT_EQ(with.stats.views, 0);
  float total = 0;
  for (float v : with.values[0]) total += v;
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(with.values[1][i], std::exp(i + 1.0f) * total, 1e-2) << i;
}

TEST(AliasViews, ProgramTextNamesTheViews) {
  RuntimeOptions options;
  // Declared first: the runtime returns its all-reduce buffers to it when destroyed.
  DoublingCommunicator comm;
  ScopedRuntime rt(options);
  rt->set_communicator(&comm);
  const std::vector<Tensor> outs = gradient_like_step();
  mark_step();
  auto program = rt->cache().find(rt->last_graph_hash());
  ASSERT_NE(program, nullptr);
  EXPECT_NE(program->text().find("view of s"), std::string::npos) << program->text();
  alias_views(*program);  // idempotent: nothing left to alias
  EXPECT_EQ(program->stats.views, 4);
}

// The all-reduced buffer comes from the communicator (its arena: the zero-copy schedule), is
// reused by later steps, and goes back when the communicator is unset.
TEST(AliasViews, AllReduceOperandLivesInTheCommunicatorsBuffer) {
  DoublingCommunicator comm;
  ScopedRuntime rt;
  rt->set_communicator(&comm);
  std::vector<float> first;
  for (int step = 0; step < 3; ++step) {
    const std::vector<Tensor> outs = gradient_like_step();
    mark_step();
    if (step == 0) first = outs[0].to_vector<float>();
    EXPECT_EQ(outs[0].to_vector<float>(), first);
  }
  EXPECT_EQ(comm.allocs, 1);
  EXPECT_EQ(comm.frees, 0);
  rt->set_communicator(nullptr);
  EXPECT_EQ(comm.frees, 1);
}

}  // namespace
}  // namespace xs
