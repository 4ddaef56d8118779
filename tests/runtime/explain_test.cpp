// The recompile explainer and recording sites: each kind of difference is named with the
// source line that recorded it (the tests compare against __LINE__ of the recording statement),
// sites cost nothing and are absent with IR debug off, the dumps show them, and the runtime's
// warnings carry the explanation.
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "tests/support/captured_log.h"
#include "tests/support/scoped_env.h"
#include "xla_spawn/runtime/autograd.h"
#include "xla_spawn/runtime/explain.h"
#include "xla_spawn/runtime/graph.h"
#include "xla_spawn/runtime/loss.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/ops.h"
#include "xla_spawn/runtime/optim/sgd.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

RuntimeOptions with_debug(bool ir_debug = true) {
  RuntimeOptions o;
  o.ir_debug = ir_debug;
  o.codegen = false;  // the explainer never runs a program; the interpreter starts fastest
  return o;
}

// "tests/runtime/explain_test.cpp:<line>", as site_text prints a site in this file.
std::string here(int line) {
  return fmt::format("tests/runtime/explain_test.cpp:{}", line);
}

// The summary of the graph under `roots`, as the runtime makes it at step `step`.
GraphSummary trace(const std::vector<Tensor>& roots, int64_t step = 1) {
  std::vector<NodePtr> nodes;
  for (const Tensor& t : roots) nodes.push_back(t.ir());
  return summarize(cut_graph(nodes, /*allow_donation=*/false), step, /*step_graph=*/true,
                   runtime().options().ir_debug);
}

#define EXPECT_HAS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "want '" << (part) << "' in:\n" << (text)

using testing::CapturedLog;

TEST(Explain, ChangedBatchSizeNamesTheInputBothShapesAndTheLineThatUsedIt) {
  ScopedRuntime rt(with_debug());
  const Tensor w = Tensor::full_data({3, 4}, 0.5);
  int line = 0;
  auto step = [&](int64_t batch) {
    const Tensor images = Tensor::full_data({batch, 3}, 1);
    const Tensor y = matmul(images, w);
    line = __LINE__ - 1;
    return trace({y}, batch == 8 ? 1 : 2);
  };
  const GraphSummary old = step(8), now = step(5);
  const std::string why = explain_recompile(old, now);
  EXPECT_HAS(why, "step 2 recompiled: input 0 shape [8, 3] -> [5, 3]");
  EXPECT_HAS(why, "operand 0 of op 2 matmul, recorded at " + here(line));
  EXPECT_HAS(why, fmt::format("compared with graph {:016x} from step 1", old.hash));
  EXPECT_EQ(why.find("XLA_SPAWN_IR_DEBUG"), std::string::npos)
      << "no hint when sites are kept: " << why;
}

// Evaluation after training steps (or generation) is a graph of its own: comparing its
// inputs with the training step's would be noise, so it is named as a different computation.
TEST(Explain, AnUnrelatedGraphIsNamedADifferentComputationNotAChangedStep) {
  ScopedRuntime rt(with_debug());
  const Tensor w = Tensor::full_data({3, 4}, 0.5);
  const Tensor images = Tensor::full_data({8, 3}, 1);
  const GraphSummary train = trace({exp(matmul(images, w)) * 2.0 + 1.0}, 1);
  const GraphSummary other = trace({sqrt(abs(neg(tanh(sigmoid(images)))))}, 2);
  const std::string why = explain_recompile(train, other);
  EXPECT_HAS(why, "step 2 recompiled: a different computation, not a changed step: it has 6 ops "
                  "and the closest cached graph 8, of which only 1 are shared");
  EXPECT_EQ(why.find("input 0"), std::string::npos) << why;
  // A small part of the cached graph: each graph's own count, not "3 of its 3".
  const GraphSummary part = trace({matmul(images, w)}, 3);
  EXPECT_HAS(explain_recompile(train, part),
             "it has 3 ops and the closest cached graph 8, of which only 3 are shared");
}

TEST(Explain, ChangedInputDtypeNamesBothDtypesAndTheOpThatReadsIt) {
  ScopedRuntime rt(with_debug());
  int line = 0;
  auto step = [&](DType dtype) {
    const Tensor x = Tensor::full_data({4}, 3, dtype);
    const Tensor y = relu(x) * 2.0;
    line = __LINE__ - 1;
    return trace({y});
  };
  const std::string why = explain_recompile(step(DType::kF32), step(DType::kF64));
  EXPECT_HAS(why, "input 0 dtype f32 -> f64");
  EXPECT_HAS(why, "operand 0 of op 1 relu, recorded at " + here(line));
}

TEST(Explain, ChangedCastNamesTheOpItsAttributeAndResultDtype) {
  ScopedRuntime rt(with_debug());
  const Tensor x = Tensor::full_data({4}, 3);
  int line = 0;
  auto step = [&](DType dtype) {
    const Tensor y = cast(x, dtype);
    line = __LINE__ - 1;
    return trace({y});
  };
  const std::string why = explain_recompile(step(DType::kF32), step(DType::kF64));
  EXPECT_HAS(why, "op 1 cast: attributes dtype f32 -> f64, result dtype f32 -> f64 (recorded at " +
                      here(line) + ")");
}

TEST(Explain, ScalarThatBecameAConstantNamesTheValueAndTheOperatorsLine) {
  ScopedRuntime rt(with_debug());
  const Tensor x = Tensor::full_data({4}, 3);
  int line = 0;
  auto step = [&](double lr) {
    const Tensor y = x * lr;  // 0.1: a data input; 1: a constant
    line = __LINE__ - 1;
    return trace({y});
  };
  const GraphSummary data = step(0.1), one = step(1), zero = step(0);
  const std::string became = explain_recompile(data, one);
  EXPECT_HAS(became, "the data scalar input 1 (f32[]) became the constant 1 (op 1) (recorded at " +
                         here(line) + ")");
  EXPECT_HAS(became, "Tensor::scalar compiles 0 and 1 in as constants");
  const std::string back = explain_recompile(one, data);
  EXPECT_HAS(back,
             "the constant 1 (op 1) became the data scalar input 1 (f32[]) (operand 1 of op 2 mul, "
             "recorded at " +
                 here(line) + ")");
  const std::string value = explain_recompile(zero, one);
  EXPECT_HAS(value, "op 1 constant: value 0 -> 1 (recorded at " + here(line) + ")");
}

TEST(Explain, NewOpAtTheEndOrInTheMiddleIsNamedWithItsLine) {
  ScopedRuntime rt(with_debug());
  const Tensor x = Tensor::full_data({4}, 3);
  const GraphSummary plain = trace({relu(x)});
  const Tensor h = relu(x);
  const Tensor y = exp(h);
  const int exp_line = __LINE__ - 1;
  const std::string added = explain_recompile(plain, trace({y}));
  EXPECT_HAS(added, "new op 2 exp (recorded at " + here(exp_line) + ")");
  EXPECT_HAS(added, "3 nodes, the cached graph 2");

  const GraphSummary summed = trace({sum(relu(x))});
  const Tensor z = sum(exp(relu(x)));
  const int mid_line = __LINE__ - 1;
  const std::string inserted = explain_recompile(summed, trace({z}));
  EXPECT_HAS(inserted, "new op 2 exp (recorded at " + here(mid_line) + ") before op 2 sum");
  const std::string removed = explain_recompile(trace({z}), summed);
  EXPECT_HAS(removed, "op 2 exp (recorded at " + here(mid_line) + ") of the cached graph is gone");
}

TEST(Explain, ChangedResultsAndDonationAreNamed) {
  ScopedRuntime rt(with_debug());
  const Tensor x = Tensor::full_data({4}, 3);
  const Tensor a = relu(x), b = exp(a);
  const std::string results = explain_recompile(trace({b}), trace({a, b}));
  EXPECT_HAS(results, "the same ops, but 2 results instead of 1");
  GraphSummary donated = trace({b});
  GraphSummary kept = donated;
  donated.donated[0] = 1;
  kept.hash ^= 1;  // as the runtime's hash would differ
  EXPECT_HAS(explain_recompile(donated, kept), "input 0 f32[4] (operand 0 of op 1 relu");
  EXPECT_HAS(explain_recompile(donated, kept), "is no longer donated");
}

// Closest: the graph's own summary (evicted program), else the same kind (step or host read),
// then the longest common prefix, then the most recently used.
TEST(Explain, ClosestPrefersSameKindThenLongestPrefixThenMostRecent) {
  ScopedRuntime rt(with_debug());
  const Tensor x = Tensor::full_data({4}, 3);
  const GraphSummary now = trace({exp(relu(relu(x)))});
  const GraphSummary shares3 = trace({sign(relu(relu(x)))}), shares1 = trace({relu(exp(x))});
  GraphSummary shares1_later = shares1;
  GraphSummary host = trace({sin(relu(relu(x)))});  // shares 3 nodes too, but a host read's
  host.step_graph = false;
  shares1_later.hash ^= 1;
  GraphHistory history(8);
  EXPECT_EQ(history.closest(now), nullptr);
  history.insert(shares3);
  history.insert(shares1);
  history.insert(host);
  ASSERT_NE(history.closest(now), nullptr);
  EXPECT_EQ(history.closest(now)->hash, shares3.hash) << "the longest prefix of the same kind";
  GraphHistory ties(8);
  ties.insert(shares1);
  ties.insert(shares1_later);
  EXPECT_EQ(ties.closest(now)->hash, shares1_later.hash) << "among equals the most recent";
  ties.touch(shares1.hash);
  EXPECT_EQ(ties.closest(now)->hash, shares1.hash) << "a cache hit makes it the most recent";
  ties.insert(now);
  EXPECT_EQ(ties.closest(now)->hash, now.hash) << "its own summary: the program was evicted";
  GraphHistory small(1);
  small.insert(shares3);
  small.insert(shares1);
  EXPECT_EQ(small.size(), 1u);
  EXPECT_EQ(small.closest(now)->hash, shares1.hash) << "the least recently used is evicted";
}

TEST(Explain, WithIrDebugOffNoSiteIsKeptAndTheMessageSaysHowToGetThem) {
  ScopedRuntime rt(with_debug(false));
  const Tensor x = Tensor::full_data({4}, 3);
  const Tensor y = relu(x) * 0.5 + 1.0;
  EXPECT_FALSE(y.ir()->site.known());
  EXPECT_FALSE(y.ir()->operands[0]->site.known());
  EXPECT_FALSE(detail::current_site().known()) << "a scope left a site behind";
  const GraphSummary s = trace({y});
  for (const GNode& n : s.nodes) EXPECT_FALSE(n.site.known()) << op_name(n.op);
  EXPECT_EQ(graph_text(cut_graph(std::vector<NodePtr>{y.ir()}, false)).find(" @ "),
            std::string::npos);
  const std::string why = explain_recompile(trace({relu(x)}), trace({exp(relu(x))}));
  EXPECT_HAS(why, "new op 2 exp (");
  EXPECT_HAS(why, "set XLA_SPAWN_IR_DEBUG=1 to see the source line that recorded each op");
}

TEST(Explain, IrDebugAndExplainRecompilesComeFromTheEnvironment) {
  {
    testing::ScopedEnv debug("XLA_SPAWN_IR_DEBUG", "1");
    testing::ScopedEnv explain("XLA_SPAWN_EXPLAIN_RECOMPILES", "1");
    const RuntimeOptions o = RuntimeOptions::from_env();
    EXPECT_TRUE(o.ir_debug);
    EXPECT_TRUE(o.explain_recompiles);
  }
  testing::ScopedEnv debug("XLA_SPAWN_IR_DEBUG", std::nullopt);
  testing::ScopedEnv explain("XLA_SPAWN_EXPLAIN_RECOMPILES", std::nullopt);
  const RuntimeOptions o = RuntimeOptions::from_env();
  EXPECT_FALSE(o.ir_debug);
  EXPECT_FALSE(o.explain_recompiles);
}

TEST(Explain, DumpShowsEachOpsSiteAndGradientsShowTheirForwardOpsLine) {
  ScopedRuntime rt(with_debug());
  Tensor w = Tensor::full_data({4}, 0.5);
  w.set_requires_grad(true);
  const Tensor loss = sum(square(w * 3.0));
  const int forward_line = __LINE__ - 1;
  backward(loss);
  const std::string text = graph_text(cut_graph(std::vector<NodePtr>{w.grad().ir()}, false));
  EXPECT_HAS(text, "mul(");
  EXPECT_HAS(text, "  @ " + here(forward_line));
  EXPECT_HAS(text, "  @ gradient of " + here(forward_line));
  EXPECT_EQ(text.find("ops.cpp"), std::string::npos) << text;
  EXPECT_EQ(text.find("grad_rules.cpp"), std::string::npos) << text;
}

// A whole training step (a layer, a loss, backward, an optimizer) records every op at a line
// a user can act on: the layer's, the loss's, the optimizer's or this file's, never one inside
// ops.cpp or the gradient rules.
TEST(Explain, TrainingStepSitesAreUserOrLayerLines) {
  ScopedRuntime rt(with_debug());
  Generator gen(1);
  Linear fc(3, 2, gen);
  SGD opt(fc.parameters(), {.lr = 0.1});
  const Tensor x = Tensor::full_data({4, 3}, 1);
  const Tensor labels = Tensor::from_vector<int64_t>({0, 1, 1, 0}, {4});
  const Tensor loss = cross_entropy(fc(x), labels);
  backward(loss);
  opt.step();
  std::vector<NodePtr> roots;
  for (const Tensor& p : fc.parameters()) roots.push_back(p.ir());
  const Graph g = cut_graph(roots, false);
  bool layer = false;
  for (const GNode& n : g.nodes) {
    if (n.op == Op::kData) continue;
    const std::string site = site_text(n.site);
    EXPECT_TRUE(n.site.known()) << op_name(n.op) << " has no site";
    for (const char* library :
         {"runtime/ops.cpp", "grad_rules.cpp", "autograd.cpp", "runtime/tensor.cpp"})
      EXPECT_EQ(site.find(library), std::string::npos) << op_name(n.op) << " at " << site;
    layer = layer || site.find("runtime/nn/linear.cpp:") != std::string::npos;
  }
  EXPECT_TRUE(layer) << "the layer's matmul reports the layer's line:\n" << graph_text(g);
}

TEST(Explain, RuntimeExplainsEveryRecompileWhenAsked) {
  RuntimeOptions o = with_debug();
  o.explain_recompiles = true;
  ScopedRuntime rt(o);
  CapturedLog log;
  const Tensor w = Tensor::full_data({3, 4}, 0.5);
  int line = 0;
  for (int64_t batch : {8, 8, 5}) {
    Tensor images = Tensor::full_data({batch, 3}, 1);
    Tensor y = relu(matmul(images, w));
    line = __LINE__ - 1;
    mark_step();
  }
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 2);
  const std::string text = log.text();
  EXPECT_HAS(text,
             "runtime: step 3 recompiled: input 0 shape [8, 3] -> [5, 3] (operand 0 of op 2 "
             "matmul, recorded at " +
                 here(line) + ")");
  EXPECT_HAS(text, "from step 1");
  EXPECT_EQ(text.find("step 2"), std::string::npos) << "a cached step explains nothing: " << text;
}

TEST(Runtime, RecompileWarningCarriesTheExplanationOfTheCompileThatFiredIt) {
  RuntimeOptions o = with_debug();
  o.warmup_steps = 1;
  o.recompile_warning_threshold = 2;
  ScopedRuntime rt(o);
  CapturedLog log;
  int line = 0;
  for (int64_t n = 1; n <= 4; ++n) {  // a new shape every step
    Tensor y = exp(Tensor::full_data({n}, 1));
    line = __LINE__ - 1;
    mark_step();
    EXPECT_EQ(rt->recompile_warning_issued(), n >= 3) << "step " << n;
  }
  const std::string text = log.text();
  EXPECT_HAS(text, "2 graphs compiled after warm-up");
  EXPECT_HAS(text, "XLA_SPAWN_EXPLAIN_RECOMPILES=1");
  EXPECT_HAS(
      text,
      "The last: step 3 recompiled: input 0 shape [2] -> [3] (operand 0 of op 1 exp, recorded at " +
          here(line) + ")");
  EXPECT_EQ(text.find("step 4 recompiled"), std::string::npos)
      << "once only, and no per-compile lines: " << text;
}

TEST(Runtime, RecompileAfterEvictionSaysTheProgramWasEvicted) {
  RuntimeOptions o = with_debug();
  o.compile_cache_size = 1;
  o.explain_recompiles = true;
  ScopedRuntime rt(o);
  CapturedLog log;
  for (int64_t n : {2, 3, 2}) {
    Tensor y = exp(Tensor::full_data({n}, 1));
    mark_step();
  }
  EXPECT_EQ(rt->metrics().counter(kCounterUncachedCompile), 3);
  EXPECT_HAS(log.text(),
             "step 3 recompiled: the same graph was compiled before and its program evicted");
}

}  // namespace
}  // namespace xs
