// train_fmnist under the real xla-spawn: replicas stay bit-identical (debug mode), a run
// SIGKILLed mid-epoch and restarted by --max-restarts ends where an uninterrupted run ends,
// one progress bar for N replicas, and bad options or checkpoints are refused clearly.
// Small subsets of the training set and few steps keep each test to seconds.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
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
using testing::count_of;
using testing::run_command;

std::string spawn_train(int n, const std::string& launcher_flags, const std::string& args) {
  return fmt::format("{} -n {} {} -- {} --train-samples 256 --test-samples 200 --batch-size 8 {}",
                     XS_XLA_SPAWN, n, launcher_flags, XS_TRAIN_FMNIST, args);
}

class ReplicasIdentical : public ::testing::TestWithParam<int> {};

TEST_P(ReplicasIdentical, DebugModeConfirmsBitIdenticalParametersEveryStep) {
  const int n = GetParam();
  const CommandResult r = run_command("XLA_SPAWN_DEBUG_REPLICAS=1 XLA_SPAWN_LOG_LEVEL=debug " +
                                      spawn_train(n, "", "--max-steps 5 --no-eval --seed 7"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int step = 1; step <= 5; ++step) {
    // Logged by every ordinal after comparing all ordinals' graph and parameter hashes.
    EXPECT_EQ(
        count_of(r.output,
                 fmt::format("step {}: graph and 6 parameters identical on {} replicas", step, n)),
        n)
        << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ReplicasIdentical, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

// Final parameters of a run, from its last checkpoint.
std::vector<HostTensor> final_tensors(const std::string& path) {
  return load_checkpoint(path).tensors;
}

TEST(TrainFmnistRestart, RunKilledMidEpochResumesToTheSameParameters) {
  testing::TempDir dir;
  // 256 samples / (2 x 8) = 16 steps per epoch; checkpoints every 4 steps; 20 steps in all.
  const std::string common = "--max-steps 20 --checkpoint-every 4 --no-eval --seed 3 --resume";
  const CommandResult whole =
      run_command(spawn_train(2, "", common + " --checkpoint " + dir.path("a")));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  // Ordinal 1 SIGKILLs itself before step 6 (mid-epoch, after the step-4 checkpoint); the
  // launcher restarts the group, which resumes at epoch 1, batch 4.
  const CommandResult killed = run_command(spawn_train(
      2, "--max-restarts 1", common + " --fail-at-step 6 --checkpoint " + dir.path("b")));
  ASSERT_EQ(killed.exit_code, 0) << killed.output;
  EXPECT_NE(killed.output.find("resumed from " + dir.path("b") + ": epoch 1, batch 4, step 4"),
            std::string::npos)
      << killed.output;
  const auto a = final_tensors(dir.path("a"));
  const auto b = final_tensors(dir.path("b"));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_TRUE(a[i].bytes == b[i].bytes) << "tensor " << a[i].name << " differs after the restart";
  }
  EXPECT_EQ(load_checkpoint(dir.path("b")).meta_int("global_step"), 20);
}

TEST(TrainFmnistProgress, ExactlyOneProgressBarForFourReplicas) {
  const CommandResult r = run_command(spawn_train(4, "", "--epochs 1 --no-eval"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int bar_lines = count_of(r.output, "epoch 1/1 [");
  EXPECT_GT(bar_lines, 0) << r.output;
  // Every bar line comes from the master ("[0] " is xla-spawn's prefix for ordinal 0).
  EXPECT_EQ(count_of(r.output, "[0] epoch 1/1 ["), bar_lines) << r.output;
  EXPECT_EQ(count_of(r.output, "epoch 1/1: "), 1) << r.output;  // one epoch summary
}

// A diverging run stops at the first non-finite loss, naming the step, instead of training on
// NaN parameters (and saving them in a checkpoint whose CRC is fine).
TEST(TrainFmnistDivergence, ANanLossStopsTheJobNamingTheStep) {
  const CommandResult r = run_command(spawn_train(2, "", "--epochs 1 --no-eval --optimizer sgd --lr 99"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(": the loss is nan on ordinal "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("train_fmnist: step "), std::string::npos) << r.output;
  EXPECT_EQ(count_of(r.output, "done: "), 0) << r.output;
}

TEST(TrainFmnistOptions, BadValuesAreRejectedNamingTheFlag) {
  CommandResult r = run_command(std::string(XS_TRAIN_FMNIST) + " --model resnet");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--model: expected mlp or cnn, got 'resnet'"), std::string::npos)
      << r.output;
  r = run_command(std::string(XS_TRAIN_FMNIST) + " --batch-size 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--batch-size: expected 1..65536, got 0"), std::string::npos) << r.output;
  r = run_command(std::string(XS_TRAIN_FMNIST) + " --resume");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--resume: expected --checkpoint PATH"), std::string::npos) << r.output;
  for (const auto& [args, says] :
       {std::pair{"--epochs 3 5", "too many positional options"},
        {"--seed -1", "--seed: expected an integer >= 0, got -1"},
        {"--weight-decay inf", "--weight-decay: expected a finite value >= 0, got inf"},
        {"--checkpoint ''", "the required argument for option '--checkpoint' is missing"},
        {"--step-timing-csv ''", "the required argument for option '--step-timing-csv' is missing"},
        {"--data-dir /no/such/dir", "--data-dir '/no/such/dir': not a directory"},
        {"--train-samples 60001", "--train-samples 60001: the training set has 60000 samples"}}) {
    r = run_command(fmt::format("{} {}", XS_TRAIN_FMNIST, args));
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << ": " << r.output;
  }
}

// A checkpoint is refused when resuming it would not continue the run it came from (another
// seed's data order, another training set's epoch), and a checkpoint that cannot be written is
// reported before the first step, not after an epoch of training.
TEST(TrainFmnistResume, AnotherSeedOrTrainingSetIsRefusedAndAnUnwritablePathFailsAtStart) {
  testing::TempDir dir;
  const std::string ckpt = dir.path("ck");
  ASSERT_EQ(
      run_command(spawn_train(1, "", "--max-steps 20 --no-eval --checkpoint " + ckpt)).exit_code, 0);
  CommandResult r =
      run_command(spawn_train(1, "", "--seed 7 --no-eval --resume --checkpoint " + ckpt));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("was trained with --seed 0, this run uses 7"), std::string::npos)
      << r.output;
  // 256 samples / 8 = 32 batches an epoch; the checkpoint resumes at batch 20 of epoch 0.
  // With 64 samples batch 20 lies past an epoch; with 200 (25 batches) it fits, but the data
  // order would differ all the same.
  for (const int samples : {64, 200}) {
    r = run_command(fmt::format("{} --train-samples {} --batch-size 8 --no-eval --resume "
                                "--checkpoint {}",
                                XS_TRAIN_FMNIST, samples, ckpt));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find(fmt::format("was trained on 256 training samples, this run uses {}",
                                        samples)),
              std::string::npos)
        << r.output;
  }
  // Another optimizer's state does not fit: named as the optimizer, not as its tensors.
  r = run_command(spawn_train(1, "", "--optimizer sgd --no-eval --resume --checkpoint " + ckpt));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("is for optimizer 'adam', this run trains 'sgd'"), std::string::npos)
      << r.output;
  r = run_command(spawn_train(1, "", "--epochs 1 --no-eval --checkpoint " + dir.path("none/ck")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("create temporary"), std::string::npos) << r.output;
  EXPECT_EQ(count_of(r.output, "epoch 1/1 ["), 0) << r.output;  // before any training
}

// Outputs that would replace one another, or that name a directory, are refused before the
// first step: they used to be found after training (a directory) or not at all (the trace or
// the CSV silently replaced the checkpoint, and the next --resume failed).
TEST(TrainFmnistOutputs, ADirectoryOrTwoOutputsOnOneFileFailAtStart) {
  testing::TempDir dir;
  std::filesystem::create_directory(dir.path("c"));
  const std::string ckpt = dir.path("ck"), csv = dir.path("t.csv");
  ASSERT_EQ(run_command(spawn_train(1, "", "--max-steps 2 --no-eval --checkpoint " + ckpt)).exit_code, 0);
  const std::vector<uint8_t> saved = testing::TempDir::read(ckpt);
  // Exit 2 for a usage error, 1 for what the system refused.
  struct Case {
    std::string launcher, args, says;
    int exit_code;
  } cases[] = {
      {"", "--checkpoint " + dir.path("c"), "checkpoint " + dir.path("c") + ": the path names a directory", 2},
      {"", "--step-timing-csv " + dir.path("c"),
       "--step-timing-csv " + dir.path("c") + ": the path names a directory", 2},
      {"", "--step-timing-csv " + dir.path("none/t.csv"), "create temporary", 1},
      // A stream (/dev/stdout, a link to a pipe here): a checkpoint renamed over it would
      // replace the link.
      {"", "--checkpoint /dev/stdout", "--checkpoint /dev/stdout: in /dev or /proc", 2},
      {"", fmt::format("--checkpoint {} --step-timing-csv {}/../ck", ckpt, dir.path("c")), "are the same file",
       2},
      // The trace on the checkpoint: refused by the launcher when the checkpoint exists, by
      // the trainer when it does not yet.
      {"--trace " + ckpt, "--checkpoint " + ckpt, "--trace " + ckpt + ": exists and is not a trace", 2},
      {"--trace " + dir.path("new"), "--checkpoint " + dir.path("new"),
       "and the job's trace (XLA_SPAWN_TRACE) " + dir.path("new"), 2},
  };
  for (const Case& c : cases) {
    const CommandResult r = run_command(spawn_train(1, c.launcher, "--epochs 1 --no-eval " + c.args));
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(count_of(r.output, "epoch 1/1 ["), 0) << r.output;  // before any training
  }
  // Nor did the launcher merge the trace over the checkpoint afterwards.
  EXPECT_EQ(testing::TempDir::read(ckpt), saved);
  EXPECT_FALSE(std::filesystem::exists(csv));
}

// One directory under two names (a bind mount) and a file not made yet: the rename targets
// the same directory entry, so the CSV would replace the checkpoint.
TEST(TrainFmnistOutputs, OneFileUnderTwoDirectoryNamesIsOneFile) {
  if (::geteuid() != 0 || std::system("unshare --version >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "needs root and unshare(1) to bind-mount a directory in a mount namespace of its own";
  }
  testing::TempDir dir;
  std::filesystem::create_directory(dir.path("real"));
  std::filesystem::create_directory(dir.path("bound"));
  const CommandResult r = run_command(fmt::format(
      "unshare -m --propagation private sh -c \"mount --bind {} {} && exec {} --train-samples 256 "
      "--batch-size 8 --max-steps 3 --no-eval --checkpoint {}/m --step-timing-csv {}/m\"",
      dir.path("real"), dir.path("bound"), XS_TRAIN_FMNIST, dir.path("bound"), dir.path("real")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("are the same file"), std::string::npos) << r.output;
}

// The CSV may go to a stream the user names (/dev/stdout, a pipe), written there directly.
TEST(TrainFmnistOutputs, TheStepTimingCsvMayGoToStandardOutput) {
  const CommandResult r = run_command(fmt::format(
      "{} --train-samples 256 --batch-size 8 --max-steps 3 --no-eval --step-timing-csv /dev/stdout",
      XS_TRAIN_FMNIST));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ordinal,epoch,step,step_ms"), std::string::npos) << r.output;
  EXPECT_EQ(count_of(r.output, "\n0,0,"), 3) << r.output;
  // A FIFO with its reader (as the shell's >(...) makes one).
  testing::TempDir dir;
  const CommandResult f = run_command(fmt::format(
      "mkfifo {0} && {{ cat {0} > {1} & }} && {2} --train-samples 256 --batch-size 8 --max-steps 3 --no-eval "
      "--step-timing-csv {0} && wait",
      dir.path("fifo"), dir.path("out.csv"), XS_TRAIN_FMNIST));
  EXPECT_EQ(f.exit_code, 0) << f.output;
  const std::vector<uint8_t> csv = testing::TempDir::read(dir.path("out.csv"));
  EXPECT_EQ(count_of(std::string(csv.begin(), csv.end()), "\n0,0,"), 3);
  // Standard output sent to a file: the CSV goes after what is there, through the descriptor.
  // (A rename over /dev/stdout, as root, replaced the machine's /dev/stdout with a file.)
  const CommandResult g = run_command(fmt::format(
      "{} --train-samples 256 --batch-size 8 --max-steps 3 --no-eval --step-timing-csv /dev/stdout > {}",
      XS_TRAIN_FMNIST, dir.path("stdout.txt")));
  EXPECT_EQ(g.exit_code, 0) << g.output;
  const std::vector<uint8_t> out = testing::TempDir::read(dir.path("stdout.txt"));
  const std::string text(out.begin(), out.end());
  EXPECT_NE(text.find("done: 3 steps"), std::string::npos) << text;
  EXPECT_EQ(count_of(text, "\n0,0,"), 3) << text;
  struct stat st {};
  ASSERT_EQ(::lstat("/dev/stdout", &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "/dev/stdout is no longer a symlink";
}

// A reader that goes away early is an error naming it, not a SIGPIPE that kills the trainer
// (1000 rows: more than a pipe holds, so the write meets the closed end).
TEST(TrainFmnistOutputs, AStreamWhoseReaderLeavesIsAnErrorNotASigpipe) {
  testing::TempDir dir;
  const CommandResult r = run_command(fmt::format(
      "mkfifo {0} && {{ head -c 100 {0} > /dev/null & }} && {1} --train-samples 1024 --batch-size 1 "
      "--max-steps 1000 --no-eval --step-timing-csv {0}",
      dir.path("fifo"), XS_TRAIN_FMNIST));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("(the reader went away): Broken pipe"), std::string::npos) << r.output;
}

TEST(TrainFmnistResume, CheckpointOfAnotherModelIsRefusedAndKept) {
  testing::TempDir dir;
  const std::string ckpt = dir.path("ck");
  ASSERT_EQ(
      run_command(spawn_train(1, "", "--max-steps 2 --no-eval --checkpoint " + ckpt)).exit_code, 0);
  const std::vector<uint8_t> before = testing::TempDir::read(ckpt);
  const CommandResult r = run_command(
      spawn_train(1, "", "--model cnn --max-steps 2 --no-eval --resume --checkpoint " + ckpt));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("is for model 'mlp', this run trains 'cnn'"), std::string::npos)
      << r.output;
  EXPECT_EQ(testing::TempDir::read(ckpt), before);
}

TEST(TrainFmnistPrecision, ABF16RunSaysWhichPathRanAndTrains) {
  CommandResult r = run_command(spawn_train(2, "", "--precision bf16 --max-steps 6 --no-eval"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("precision: bf16 autocast"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("gradients exchanged in bf16"), std::string::npos) << r.output;
  EXPECT_EQ(count_of(r.output, "done: "), 1) << r.output;
  r = run_command("XLA_SPAWN_PRECISION=bf16 XLA_SPAWN_GRAD_EXCHANGE=f32 " +
                  spawn_train(2, "", "--max-steps 2 --no-eval"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("gradients exchanged in f32 (XLA_SPAWN_GRAD_EXCHANGE=f32)"),
            std::string::npos)
      << r.output;
  r = run_command(std::string(XS_TRAIN_FMNIST) + " --precision f16");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--precision: expected f32 or bf16, got 'f16'"), std::string::npos)
      << r.output;
  // From the environment, the message names the variable that was set.
  r = run_command("XLA_SPAWN_PRECISION=BF16 " + std::string(XS_TRAIN_FMNIST));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("XLA_SPAWN_PRECISION: expected f32 or bf16, got 'BF16'"),
            std::string::npos)
      << r.output;
}

// The bytes the sharded update's reduce-scatter moves per step (from a trace of the job): half
// in bf16, for the CNN too, whose 1-channel conv1 autocast leaves in f32.
TEST(TrainFmnistPrecision, TheCNNsGradientsCrossInHalfTheBytes) {
  testing::TempDir dir;
  int64_t bytes[2] = {0, 0};
  for (int bf16 : {0, 1}) {
    const std::string trace = dir.path(bf16 ? "bf16.json" : "f32.json");
    const CommandResult r = run_command(spawn_train(
        2, "--trace " + trace,
        fmt::format("--model cnn --max-steps 3 --no-eval --precision {}", bf16 ? "bf16" : "f32")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<uint8_t> raw = testing::TempDir::read(trace);
    const std::string text(raw.begin(), raw.end());
    const std::regex span(R"re("name":"reduce_scatter"[^}]*"pid":0,[^}]*"bytes":([0-9]+))re");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), span); it != std::sregex_iterator(); ++it)
      bytes[bf16] += std::stoll((*it)[1]);
  }
  EXPECT_GT(bytes[0], 3 * 3'000'000);  // three steps of the CNN's 3.27 M f32 gradients
  EXPECT_EQ(bytes[1] * 2, bytes[0]);
}

// An f32 run's checkpoint resumes under XLA_SPAWN_USE_BF16=1, whose checkpoint (f32 on disk)
// resumes an f32 run.
TEST(TrainFmnistPrecision, CheckpointsMoveBetweenF32AndBF16Runs) {
  testing::TempDir dir;
  const std::string ckpt = dir.path("ck");
  const std::string args = "--no-eval --checkpoint-every 2 --resume --checkpoint " + ckpt;
  ASSERT_EQ(run_command(spawn_train(2, "", "--max-steps 4 " + args)).exit_code, 0);
  CommandResult r =
      run_command("XLA_SPAWN_USE_BF16=1 " + spawn_train(2, "", "--max-steps 8 " + args));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("precision: bf16 everywhere"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed from " + ckpt), std::string::npos) << r.output;
  for (const HostTensor& t : load_checkpoint(ckpt).tensors) {
    if (t.dtype != DType::kI64) {
      EXPECT_EQ(t.dtype, DType::kF32) << t.name;
    }
  }
  r = run_command(spawn_train(2, "", "--max-steps 12 " + args));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 8"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace xs
