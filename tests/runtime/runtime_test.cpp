// The runtime's behaviour around the compiler: tensors, record-time errors, host reads,
// metrics, the recompile warning, graph dumps and runtime isolation.
#include <unistd.h>

#include <filesystem>
#include <cstring>
#include <functional>
#include <optional>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/buffer.h"
#include "xla_spawn/runtime/node.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/runtime.h"
#include "tests/support/scoped_env.h"

namespace xs {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument thrown)";
}

TEST(Tensor, OpsRecordWithoutRunningUntilMarkStep) {
  ScopedRuntime rt;
  const Tensor x = Tensor::from_vector<float>({1, -2, 3, -4}, {2, 2});
  Tensor y = relu(x) * 2.0;
  EXPECT_TRUE(y.is_pending());
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 0);
  mark_step();
  EXPECT_FALSE(y.is_pending());
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{2, 0, 6, 0}));
}

TEST(Tensor, ShapeMismatchIsReportedAtRecordTimeWithOpAndBothShapes) {
  ScopedRuntime rt;
  const Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 3});
  const std::string msg = error_of([&] { add(a, b); });
  EXPECT_NE(msg.find("add"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 3]"), std::string::npos) << msg;
  const std::string mm = error_of([&] { matmul(a, b); });
  EXPECT_NE(mm.find("matmul"), std::string::npos) << mm;
  EXPECT_NE(mm.find("f32[2, 3]"), std::string::npos) << mm;
  EXPECT_NE(mm.find("f32[4, 3]"), std::string::npos) << mm;
}

TEST(Tensor, DtypeMismatchIsReportedAtRecordTime) {
  ScopedRuntime rt;
  const Tensor a = Tensor::zeros({3}), b = Tensor::zeros({3}, DType::kI32);
  const std::string msg = error_of([&] { mul(a, b); });
  EXPECT_NE(msg.find("mul"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32[3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("i32[3]"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { exp(b); }).find("floating"), std::string::npos);
}

TEST(Tensor, OutOfRangeIndexFailsTheStepNamingTheIndex) {
  ScopedRuntime rt;
  const Tensor x = Tensor::zeros({2, 3});
  const Tensor idx = Tensor::from_vector<int64_t>({0, 5}, {2, 1});
  Tensor g = gather(x, 1, idx);
  const std::string msg = error_of([&] { mark_step(); });
  EXPECT_NE(msg.find("gather: index 5"), std::string::npos) << msg;
}

// The failed step may have written a donated buffer already (w's update reuses w's old
// buffer): running w's pending value again would double it twice. It is lost instead, until
// assigned; a value that did not depend on a donated buffer stays pending and runs again.
TEST(Tensor, AStepThatFailsAfterAnInPlaceUpdateLosesTheUpdatedTensorRatherThanApplyItTwice) {
  ScopedRuntime rt;
  Tensor w = Tensor::from_vector<float>({1, 2}, {2});
  w.assign(w * 2.0);
  const Tensor base = Tensor::from_vector<float>({3}, {1});  // held: not donated
  const Tensor unrelated = base + 1.0;
  Tensor bad = gather(Tensor::from_vector<float>({1, 2}, {2, 1}), 0,
                      cast(Tensor::from_vector<float>({5}, {1, 1}) * 2.0, DType::kI32));
  EXPECT_NE(error_of([] { mark_step(); }).find("gather: index 10"), std::string::npos);
  bad = Tensor();
  const std::string read = error_of([&] { w.to_vector<float>(); });
  EXPECT_NE(read.find("this tensor's value was lost: the step that computed it failed (gather: "
                      "index 10"),
            std::string::npos)
      << read;
  EXPECT_NE(error_of([&] { w + 1.0; }).find("value was lost"), std::string::npos);
  EXPECT_EQ(unrelated.to_vector<float>(), std::vector<float>{4});
  w.assign(Tensor::from_vector<float>({5, 6}, {2}));
  mark_step();
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{5, 6}));
}

// backward() through a loss recorded before a step that updated one of its inputs in place
// read the updated values: the step donated the input's buffer although autograd still held
// IR over it (directly, or under a computed value such as s * 3). Such buffers are no longer
// donated, so the gradient is the recorded loss's: d/dw sum(w * (s * 3)) = 3 s at the old s.
TEST(Tensor, BackwardAfterAStepUpdatedAnInputInPlaceUsesTheRecordedValues) {
  ScopedRuntime rt;
  Tensor p = Tensor::from_vector<float>({1, 2}, {2});
  p.set_requires_grad(true);
  Tensor w = Tensor::from_vector<float>({1, 1}, {2});
  w.set_requires_grad(true);
  Tensor s = Tensor::from_vector<float>({1, 2}, {2});
  mark_step();
  const Tensor loss = sum(p * p) + sum(w * (s * 3.0));
  EXPECT_DOUBLE_EQ(loss.item(), 14.0);  // a host read, as a training loop logs its loss
  {
    NoGradGuard no_grad;
    p.assign(p * 2.0);
    s.assign(s * 10.0);
  }
  mark_step();
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{2, 4}));
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{10, 20}));
  backward(loss);
  EXPECT_EQ(p.grad().to_vector<float>(), (std::vector<float>{2, 4}));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{3, 6}));
}

// The safety net under that rule: a leaf whose buffer a run has overwritten since it was made
// is refused when used again.
TEST(Tensor, IrOverABufferOverwrittenSinceIsRefused) {
  ScopedRuntime rt;
  BufferPtr buffer = Buffer::allocate(2 * sizeof(float));
  const NodePtr leaf = make_data(buffer, {{2}, DType::kF32});
  buffer->bump_version();  // what a run that was given the buffer to overwrite does
  EXPECT_NE(error_of([&] { make_node(Op::kExp, {leaf}, {}); })
                .find("a f32[2] value recorded before a step updated it in place"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Tensor::from_ir(leaf); }).find("recorded before a step"),
            std::string::npos);
}

TEST(Tensor, NegativeAndOverflowingShapesAreRefusedAndEmptyAxesOnlyWhenReduced) {
  ScopedRuntime rt;
  constexpr int64_t k32 = int64_t{1} << 32;
  EXPECT_NE(error_of([] { Tensor::full({k32, k32}, 2.0); }).find("more than 2^56 elements"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tensor::from_vector<float>(std::vector<float>{}, {k32, k32}); })
                .find("more than 2^56 elements"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tensor::full_data({-2, 3}, 1.0); }).find("dimension -2 is negative"),
            std::string::npos);
  EXPECT_EQ(Tensor::zeros({k32, k32, 0}).numel(), 0);  // empty, whatever the other dimensions
  // An empty batch: reducing the non-empty axis is fine, the empty one is not.
  const Tensor empty = Tensor::from_vector<float>(std::vector<float>{}, {0, 4});
  const Tensor m = max(empty, {1});
  const Tensor ls = log_softmax(empty, 1);
  mark_step();
  EXPECT_EQ(m.shape(), (Shape{0}));
  EXPECT_EQ(ls.shape(), (Shape{0, 4}));
  EXPECT_NE(error_of([&] { max(empty, {0}); }).find("max/min over the empty axis 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { argmax(empty, 0); }).find("argmax"), std::string::npos);
}

TEST(Tensor, ItemAndPrintingForceTheValue) {
  ScopedRuntime rt;
  const Tensor s = sum(Tensor::from_vector<double>({1.5, 2.5}, {2}));
  EXPECT_DOUBLE_EQ(s.item(), 4.0);
  std::ostringstream os;
  os << exp(Tensor::zeros({2}));
  EXPECT_EQ(os.str(), "Tensor(f32[2], [1, 1])");
  EXPECT_NE(error_of([&] { Tensor::zeros({2}).item(); }).find("2 elements"), std::string::npos);
}

TEST(Tensor, CompositesMatchTheirDefinitions) {
  ScopedRuntime rt;
  const Tensor x = Tensor::from_vector<double>({1, 2, 3, 1000, 1000, 1000}, {2, 3});
  const std::vector<double> sm = softmax(x, 1).to_vector<double>();
  const std::vector<double> lsm = log_softmax(x, 1).to_vector<double>();
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(sm[0], std::exp(1.0) / z, 1e-12);
  EXPECT_NEAR(sm[4], 1.0 / 3, 1e-12);  // stable for large logits
  EXPECT_NEAR(lsm[2], 3 - std::log(z), 1e-12);
  EXPECT_NEAR(logsumexp(x, 1).to_vector<double>()[1], 1000 + std::log(3.0), 1e-9);
}

TEST(Runtime, ScopedRuntimeStartsFreshAndRestoresThePrevious) {
  ScopedRuntime outer;
  Tensor a = exp(Tensor::zeros({2}));
  mark_step();
  EXPECT_EQ(outer->metrics().counter(kCounterMarkStep), 1);
  {
    ScopedRuntime inner;
    EXPECT_EQ(&runtime(), &inner.get());
    EXPECT_EQ(inner->metrics().counter(kCounterMarkStep), 0);
    EXPECT_EQ(inner->live_tensors(), 0u);
  }
  EXPECT_EQ(&runtime(), &outer.get());
  EXPECT_EQ(outer->live_tensors(), 1u);
}

TEST(Runtime, MetricsReportUsesThePyTorchXlaLayout) {
  ScopedRuntime rt;
  Tensor y = exp(Tensor::zeros({4}));
  mark_step();
  const std::string report = metrics_report();
  for (const char* want : {"Metric: CompileTime", "Metric: ExecuteTime", "TotalSamples: 1", "Accumulator: ",
                           "Percentiles: 1%=", "50%=", "99%=", "Counter: UncachedCompile", "Counter: MarkStep\n  Value: 1"}) {
    EXPECT_NE(report.find(want), std::string::npos) << "missing '" << want << "' in\n" << report;
  }
}

TEST(Runtime, WarnsOnceWhenGraphsKeepCompilingAfterWarmUp) {
  RuntimeOptions o;
  o.warmup_steps = 2;
  o.recompile_warning_threshold = 2;
  ScopedRuntime rt(o);
  for (int64_t n = 1; n <= 6; ++n) {  // a new shape every step: the dynamic-shape trap
    Tensor y = exp(Tensor::zeros({n}));
    mark_step();
    EXPECT_EQ(rt->recompile_warning_issued(), n >= 4) << "step " << n;
  }
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 6);
}

TEST(Runtime, StableStepsNeverWarn) {
  RuntimeOptions o;
  o.warmup_steps = 1;
  o.recompile_warning_threshold = 1;
  ScopedRuntime rt(o);
  for (int i = 0; i < 5; ++i) {
    Tensor y = exp(Tensor::zeros({3}));
    mark_step();
  }
  EXPECT_FALSE(rt->recompile_warning_issued());
}

TEST(Runtime, DumpsEachCompiledGraphAsTextAndDotNamedByHash) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("xs_dump_" + std::to_string(::getpid()));
  testing::ScopedEnv env("XLA_SPAWN_DUMP_GRAPHS", dir.string());
  {
    ScopedRuntime rt;
    Tensor y = relu(Tensor::from_vector<float>({1, 2}, {2}) + 3.0);
    mark_step();
    const std::string base = fmt::format("{}/graph_{:016x}", dir.string(), rt->last_graph_hash());
    std::ifstream txt(base + ".txt"), dot(base + ".dot");
    ASSERT_TRUE(txt.good() && dot.good()) << base;
    std::stringstream t, d;
    t << txt.rdbuf();
    d << dot.rdbuf();
    EXPECT_NE(t.str().find(fmt::format("hash={:016x}", rt->last_graph_hash())), std::string::npos) << t.str();
    EXPECT_NE(t.str().find("relu"), std::string::npos);
    EXPECT_NE(d.str().find("digraph"), std::string::npos);
    EXPECT_NE(d.str().find("->"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
  // A directory that cannot be made (a file is in the way) is an error naming the variable.
  std::ofstream(dir.string()) << "a file\n";
  {
    ScopedRuntime rt;
    Tensor y = relu(Tensor::from_vector<float>({1, 2}, {2}) + 3.0);
    try {
      mark_step();
      ADD_FAILURE() << "dumped into a file";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("XLA_SPAWN_DUMP_GRAPHS=" + dir.string() +
                                           ": cannot create the directory"),
                std::string::npos)
          << e.what();
    }
  }
  std::filesystem::remove(dir);
}

TEST(Runtime, TensorsOutlivingTheirRuntimeFailClearly) {
  Tensor y;
  {
    ScopedRuntime rt;
    y = exp(Tensor::zeros({2}));
  }
  EXPECT_NE(error_of([&] { y.to_vector<float>(); }).find("runtime was destroyed"), std::string::npos);
}

}  // namespace
}  // namespace xs

namespace xs {
namespace {

// World size 2 in one process: the "other replica" reports `peer_hash` for its graph.
class PeerHashCommunicator : public Communicator {
 public:
  explicit PeerHashCommunicator(std::optional<uint64_t> peer_hash) : peer_hash_(peer_hash) {}
  int ordinal() const override { return 0; }
  int world_size() const override { return 2; }
  void all_reduce(void*, size_t, DType, ReduceOp) override {
    ++all_reduces;
    // As the shared-memory communicator's call-header check when the peer is elsewhere.
    if (peer_in_rendezvous) throw PeerFailure("all_reduce: mismatched collective calls");
  }
  void broadcast(void*, size_t, DType, int) override {}
  void all_gather(const void*, void*, size_t, DType) override {}
  void reduce_scatter(const void*, void*, size_t, DType, ReduceOp) override {}
  void barrier() override {}
  std::vector<std::vector<std::byte>> rendezvous(const std::string& tag, std::span<const std::byte> mine) override {
    last_tag = tag;
    ++rendezvous_calls;
    std::vector<std::byte> theirs(mine.begin(), mine.end());
    if (peer_hash_) std::memcpy(theirs.data(), &*peer_hash_, sizeof(uint64_t));
    return {std::vector<std::byte>(mine.begin(), mine.end()), theirs};
  }
  int all_reduces = 0;
  int rendezvous_calls = 0;
  bool peer_in_rendezvous = false;
  std::string last_tag;

 private:
  std::optional<uint64_t> peer_hash_;
};

TEST(Runtime, ReplicasTracingTheSameGraphRunTheirAllReduce) {
  // Declared first: the runtime returns its all-reduce buffers to it when destroyed.
  PeerHashCommunicator comm(std::nullopt);
  ScopedRuntime rt;
  rt->set_communicator(&comm);
  Tensor g = all_reduce(Tensor::from_vector<float>({1, 2}, {2}), ReduceOp::kSum);
  mark_step();
  EXPECT_EQ(comm.all_reduces, 1);
  EXPECT_EQ(comm.last_tag, "xs.runtime.graph_hash");
  EXPECT_GE(rt->metrics().timer(kTimerAllReduceTime).count, 1);
}

TEST(Runtime, GraphHashMismatchAcrossReplicasIsAPeerFailureNamingBoth) {
  // Declared first: the runtime returns its all-reduce buffers to it when destroyed.
  PeerHashCommunicator comm(0x1234);
  ScopedRuntime rt;
  rt->set_communicator(&comm);
  Tensor g = all_reduce(Tensor::from_vector<float>({1, 2}, {2}), ReduceOp::kSum);
  try {
    mark_step();
    FAIL() << "expected PeerFailure";
  } catch (const PeerFailure& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ordinal 1 traced 0000000000001234"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ordinal 0 traced"), std::string::npos) << msg;
  }
  EXPECT_EQ(comm.all_reduces, 0);
}

// One step of a graph with an all_reduce of `n` elements (the size changes the graph).
void all_reduce_step(int64_t n) {
  Tensor g = all_reduce(Tensor::full_data({n}, 1.0) * 2.0, ReduceOp::kSum);
  mark_step();
}

TEST(Runtime, RepeatedGraphSkipsTheGraphHashRendezvous) {
  // Declared first: the runtime returns its all-reduce buffers to it when destroyed.
  PeerHashCommunicator comm(std::nullopt);
  ScopedRuntime rt;
  rt->set_communicator(&comm);
  for (int step = 0; step < 3; ++step) all_reduce_step(2);
  EXPECT_EQ(comm.all_reduces, 3);
  EXPECT_EQ(comm.rendezvous_calls, 1);
  EXPECT_EQ(rt->metrics().counter(kCounterGraphHashCheck), 1);
  all_reduce_step(3);  // a different graph is checked again, then repeats freely
  all_reduce_step(3);
  EXPECT_EQ(comm.rendezvous_calls, 2);
  all_reduce_step(2);  // back to the first: it differs from the last one checked
  EXPECT_EQ(comm.rendezvous_calls, 3);
}

TEST(Runtime, GraphChangedOnlyOnAPeerFailsNamingTheSkippedCheck) {
  // Declared first: the runtime returns its all-reduce buffers to it when destroyed.
  PeerHashCommunicator comm(std::nullopt);
  ScopedRuntime rt;
  rt->set_communicator(&comm);
  all_reduce_step(2);
  comm.peer_in_rendezvous = true;  // our graph repeats, the peer's changed
  try {
    all_reduce_step(2);
    FAIL() << "expected PeerFailure";
  } catch (const PeerFailure& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("skipped the check"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mismatched collective calls"), std::string::npos) << msg;
  }
}

TEST(Buffer, FreedBuffersAreReusedFromThePool) {
  Buffer::trim_pool();
  const void* first;
  {
    BufferPtr b = Buffer::allocate(100'000);
    first = b->data();
  }
  EXPECT_GE(Buffer::pooled_bytes(), 100'000u);
  BufferPtr again = Buffer::allocate(100'000);
  EXPECT_EQ(again->data(), first);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(again->data()) % Buffer::kAlignment, 0u);
}

}  // namespace
}  // namespace xs

namespace xs {
namespace {

TEST(Metrics, TimerKeepsCountTotalAndPercentiles) {
  Metrics m;
  for (int i = 1; i <= 100; ++i) m.record_ns("T", i * 1000.0);
  const TimerStats t = m.timer("T");
  EXPECT_EQ(t.count, 100);
  EXPECT_DOUBLE_EQ(t.total_ns, 5050 * 1000.0);
  EXPECT_NEAR(t.percentile_ns(50), 50'500, 1000);
  EXPECT_NEAR(t.percentile_ns(99), 99'000, 1000);
  EXPECT_EQ(m.counter("never"), 0);
  m.increment("C", 3);
  EXPECT_EQ(m.counter("C"), 3);
  m.reset();
  EXPECT_EQ(m.counter("C"), 0);
  EXPECT_EQ(m.timer("T").count, 0);
}

TEST(Metrics, TimerWindowKeepsTheMostRecentSamples) {
  Metrics m;
  const int n = static_cast<int>(Metrics::kMaxSamples);
  // n samples of 1 us, then n + 7 of 2..(n + 8) us: only the last n remain.
  for (int i = 0; i < n; ++i) m.record_ns("T", 1000.0);
  for (int i = 2; i < n + 9; ++i) m.record_ns("T", i * 1000.0);
  const TimerStats t = m.timer("T");
  EXPECT_EQ(t.count, 2 * n + 7);
  ASSERT_EQ(t.samples_ns.size(), Metrics::kMaxSamples);
  EXPECT_DOUBLE_EQ(t.percentile_ns(0), 9000.0);
  EXPECT_DOUBLE_EQ(t.percentile_ns(100), (n + 8) * 1000.0);
  EXPECT_DOUBLE_EQ(m.total_ns("T"), t.total_ns);
  EXPECT_EQ(m.total_ns("never"), 0);
}

}  // namespace
}  // namespace xs
