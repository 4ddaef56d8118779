// The train_lm binary, alone and under the real xla-spawn, on a small generated corpus with a
// tiny model: the compile counters per batching mode (the acceptance 3), generation's
// single graph, bit-identical reruns, a resumed run ending where an uninterrupted one does,
// N = 2 against N = 1 at one global batch, and bad input refused with a clear message.
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "xla_spawn/replica/checkpoint.h"
#include "tests/replica/run_command.h"
#include "tests/replica/temp_dir.h"

namespace xs {
namespace {

using testing::CommandResult;
using testing::run_command;

// 400 lines of 1..60 characters of made-up words: every bucket of 8,16,32 gets rows.
std::string write_corpus(const testing::TempDir& dir, const std::string& name, const std::string& letters) {
  const std::string path = dir.path(name);
  std::ofstream out(path);
  uint64_t h = 7;
  for (int line = 0; line < 400; ++line) {
    const int length = 1 + line * 37 % 60;
    std::string text;
    for (int i = 0; i < length; ++i) {
      h = h * 6364136223846793005ull + 1442695040888963407ull;
      text.push_back(i % 6 == 5 ? ' ' : letters[(h >> 33) % letters.size()]);
    }
    out << text << "\n";
  }
  return path;
}

// A tiny model (width `d_model`) and schedule, so a run takes about a second.
std::string tiny(int d_model) {
  return fmt::format("--layers 1 --d-model {} --heads 2 --context 32 --warmup 1 --eval-batches 2 --seed 3", d_model);
}

std::string train(const std::string& corpus, const std::string& args, int n = 0, int d_model = 16) {
  const std::string cmd = fmt::format("{} --corpus {} {} {}", XS_TRAIN_LM, corpus, tiny(d_model), args);
  return n == 0 ? cmd : fmt::format("{} -n {} -- {}", XS_XLA_SPAWN, n, cmd);
}

int64_t counter(const std::string& output, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("Counter: " + name + "\\n  Value: (\\d+)"))) return -1;
  return std::stoll(m[1]);
}

double final_validation_loss(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("validation loss ([0-9.]+) nats/char, [0-9]+ tokens/s"))) return -1;
  return std::stod(m[1]);
}

TEST(TrainLmCompiles, BucketedDocumentsCompileOneTrainingGraphPerBucketPlusEvaluation) {
  testing::TempDir dir;
  const std::string corpus = write_corpus(dir, "text", "abcdefgh");
  const CommandResult r = run_command(
      train(corpus, "--batching docs --buckets 8,16,32 --batch-size 4 --steps 60 --sample-chars 0 --metrics"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Three training graphs (one per bucket; 60 steps meet all three) and one evaluation graph.
  EXPECT_EQ(counter(r.output, "UncachedCompile"), 4) << r.output;
  EXPECT_EQ(r.output.find("compiled after warm-up"), std::string::npos) << r.output;
}

TEST(TrainLmCompiles, UnbucketedDocumentsRecompilePerNewLengthAndTheWarningFires) {
  testing::TempDir dir;
  const std::string corpus = write_corpus(dir, "text", "abcdefgh");
  const CommandResult r = run_command(
      train(corpus, "--batching docs --buckets none --batch-size 4 --steps 60 --sample-chars 0 --metrics"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Rows of 1..32 tokens, 4 to a batch: the longest of four takes several values, each a graph.
  EXPECT_GE(counter(r.output, "UncachedCompile"), 6) << r.output;
  EXPECT_NE(r.output.find("compiled after warm-up"), std::string::npos) << r.output;
}

TEST(TrainLmCompiles, GenerationCompilesOneGraphHoweverLongTheText) {
  testing::TempDir dir;
  const std::string corpus = write_corpus(dir, "text", "abcdefgh");
  const std::string common = "--batch-size 4 --steps 4 --metrics";
  const CommandResult without = run_command(train(corpus, common + " --sample-chars 0"));
  const CommandResult with = run_command(train(corpus, common + " --sample-chars 150"));
  ASSERT_EQ(without.exit_code, 0) << without.output;
  ASSERT_EQ(with.exit_code, 0) << with.output;
  // 150 characters from a 32-token window: the window slides, the graph stays.
  EXPECT_EQ(counter(with.output, "UncachedCompile"), counter(without.output, "UncachedCompile") + 1)
      << with.output;
  EXPECT_NE(with.output.find("sample (temperature 0.8):"), std::string::npos) << with.output;
}

std::vector<HostTensor> tensors(const std::string& path) { return load_checkpoint(path).tensors; }

void expect_same_tensors(const std::string& a, const std::string& b, const std::string& what) {
  const auto x = tensors(a), y = tensors(b);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].name, y[i].name);
    EXPECT_TRUE(x[i].bytes == y[i].bytes) << what << ": " << x[i].name << " differs";
  }
}

TEST(TrainLmResume, RerunsAreBitIdenticalAndAResumedRunEndsWhereAnUninterruptedOneDoes) {
  testing::TempDir dir;
  const std::string corpus = write_corpus(dir, "text", "abcdefgh");
  const std::string common = "--batch-size 4 --steps 12 --sample-chars 0 --resume --checkpoint ";
  for (const char* name : {"a", "b"}) {
    const CommandResult r = run_command(train(corpus, common + dir.path(name)));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  expect_same_tensors(dir.path("a"), dir.path("b"), "rerun");
  const CommandResult first = run_command(train(corpus, common + dir.path("c") + " --max-steps 5"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(load_checkpoint(dir.path("c")).meta_int("global_step"), 5);
  const CommandResult rest = run_command(train(corpus, common + dir.path("c")));
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  EXPECT_NE(rest.output.find("resumed from " + dir.path("c") + " at step 5"), std::string::npos) << rest.output;
  expect_same_tensors(dir.path("a"), dir.path("c"), "resumed");
  EXPECT_TRUE(std::filesystem::exists(dir.path("c") + ".vocab")) << "the vocabulary beside the checkpoint";
}

TEST(TrainLmReplicas, TwoReplicasAtTheSameGlobalBatchEndWithinTwoPercentOfOne) {
  testing::TempDir dir;
  const std::string corpus = write_corpus(dir, "text", "abcdefgh");
  const CommandResult one = run_command(train(corpus, "--batch-size 4 --steps 30 --sample-chars 0"));
  const CommandResult two = run_command(train(corpus, "--batch-size 2 --steps 30 --sample-chars 0", 2));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const double a = final_validation_loss(one.output), b = final_validation_loss(two.output);
  ASSERT_GT(a, 0) << one.output;
  ASSERT_GT(b, 0) << two.output;
  EXPECT_NEAR(b / a, 1.0, 0.02) << "N=1 " << a << ", N=2 " << b;
}

TEST(TrainLmBadInput, ACheckpointOfAnotherModelOrVocabularyIsRefusedByName) {
  testing::TempDir dir;
  const std::string corpus = write_corpus(dir, "text", "abcdefgh");
  const std::string other = write_corpus(dir, "other", "xyz");
  const std::string ckpt = " --batch-size 4 --steps 3 --sample-chars 0 --resume --checkpoint " + dir.path("m");
  ASSERT_EQ(run_command(train(corpus, ckpt)).exit_code, 0);
  const CommandResult wider = run_command(train(corpus, ckpt, 0, 32));
  EXPECT_EQ(wider.exit_code, 2) << wider.output;
  EXPECT_NE(wider.output.find("holds model L1-D16-H2-T32-V10"), std::string::npos) << wider.output;
  const CommandResult vocab = run_command(train(other, ckpt));
  EXPECT_EQ(vocab.exit_code, 2) << vocab.output;
  EXPECT_NE(vocab.output.find("over a 10-character vocabulary"), std::string::npos) << vocab.output;
  std::string reseeded = train(corpus, ckpt);
  reseeded.replace(reseeded.find("--seed 3"), 8, "--seed 7");
  const CommandResult seed = run_command(reseeded);
  EXPECT_EQ(seed.exit_code, 2) << seed.output;
  EXPECT_NE(seed.output.find("was trained with --seed 3, this run uses 7"), std::string::npos) << seed.output;
}

TEST(TrainLmBadInput, AnEmptyOrBinaryCorpusAndBadFlagsExitWithUsageErrors) {
  testing::TempDir dir;
  std::ofstream(dir.path("empty")) << "";
  std::ofstream(dir.path("bin"), std::ios::binary) << std::string("\x7f" "ELF\0\0\0", 7);
  for (const auto& [args, says] : {std::pair{"--corpus " + dir.path("empty"), std::string("no text")},
                                   {"--corpus " + dir.path("bin"), "binary"},
                                   {"--buckets 8,16 --batching docs", "ending at --context 128"},
                                   {"--buckets \"32, 64,128\" --batching docs", "ascending lengths"},
                                   {"--buckets 32,+64,128 --batching docs", "ascending lengths"},
                                   {"--heads 3", "a divisor of --d-model 128"},
                                   {"--buckets 32,64,128", "--buckets: expected --batching docs with it"},
                                   {"--temperature inf", "--temperature: expected a finite value > 0"},
                                   {"--checkpoint ''", "the required argument for option '--checkpoint' is missing"},
                                   {"--step-timing-csv ''", "the required argument for option '--step-timing-csv' is missing"},
                                   {"--seed -1", "--seed: expected an integer >= 0, got -1"},
                                   {"--steps 3 5", "too many positional options"},
                                   {"--d-model 1000000 --heads 4", "fit in this machine's"}}) {
    const CommandResult r = run_command(fmt::format("{} {}", XS_TRAIN_LM, args));
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << ": " << r.output;
  }
}

// Every replica of a machine holds its own copy of the model: a model that would fit once but
// not four times is refused in a replica of four, before anything is allocated.
TEST(TrainLmBadInput, AModelThatFitsOnceButNotOncePerReplicaIsRefused) {
  const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                        static_cast<double>(::sysconf(_SC_PAGESIZE));
  // 4 layers of d_model d: about 48 d^2 parameters, 16 bytes each to train: half the memory.
  const auto d = static_cast<int64_t>(std::sqrt(memory / 2 / 768) / 4) * 4;
  const CommandResult r = run_command(fmt::format(
      "env XLA_SPAWN_ORDINAL=0 XLA_SPAWN_LOCAL_ORDINAL=0 XLA_SPAWN_WORLD_SIZE=4 "
      "XLA_SPAWN_LOCAL_WORLD_SIZE=4 {} --d-model {} --heads 4 --layers 4",
      XS_TRAIN_LM, d));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("for 4 replica(s) here"), std::string::npos) << r.output;
}

TEST(TrainLmBadInput, AnUnknownGemmBackendFailsAtStartNamingTheVariable) {
  testing::TempDir dir;
  const std::string corpus = write_corpus(dir, "text", "abcdefgh");
  const CommandResult r = run_command("XLA_SPAWN_GEMM=mkl " + train(corpus, "--max-steps 1 --sample-chars 0"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("XLA_SPAWN_GEMM=mkl: expected auto or openblas"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 1"), std::string::npos) << "trained before refusing: " << r.output;
}

}  // namespace
}  // namespace xs
