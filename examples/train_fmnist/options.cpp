#include "examples/train_fmnist/options.h"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <boost/program_options.hpp>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "examples/cli.h"

namespace xs::fmnist {
namespace po = boost::program_options;
using examples::require;
namespace {

po::options_description describe(TrainOptions& o) {
  po::options_description d(
      "train_fmnist: trains an MLP or CNN on Fashion-MNIST, alone or "
      "under xla-spawn\nOptions");
  d.add_options()("help,h", "this text")("model", po::value(&o.model)->default_value(o.model),
                                         "mlp (784-512-512-10) or cnn")(
      "epochs", po::value(&o.epochs)->default_value(o.epochs), "epochs to train")(
      "batch-size", po::value(&o.batch_size)->default_value(o.batch_size), "batch per replica")(
      "optimizer", po::value(&o.optimizer)->default_value(o.optimizer), "sgd, adam or adamw")(
      "lr", po::value(&o.lr), "learning rate (default 1e-3 for adam/adamw, 0.05 for sgd)")(
      "momentum", po::value(&o.momentum)->default_value(o.momentum), "SGD momentum")(
      "weight-decay", po::value(&o.weight_decay)->default_value(o.weight_decay), "weight decay")(
      "schedule", po::value(&o.schedule)->default_value(o.schedule), "cosine or constant")(
      "precision", po::value(&o.precision),
      "f32, or bf16: matmul and conv in bf16 under autocast, f32 master weights (default: "
      "$XLA_SPAWN_PRECISION, else f32)")(
      "seed", po::value(&o.seed)->default_value(o.seed), "seed of initialisation and data order")(
      "checkpoint", po::value(&o.checkpoint), "checkpoint file (saved each epoch)")(
      "checkpoint-every", po::value(&o.checkpoint_every)->default_value(0),
      "also save every K steps (0: at epoch ends only)")("resume", po::bool_switch(&o.resume),
                                                         "resume from --checkpoint if it exists")(
      "data-dir", po::value(&o.data_dir), "Fashion-MNIST directory (IDX .gz files)")(
      "metrics", po::bool_switch(&o.metrics), "print the runtime's metrics report at the end")(
      "max-steps", po::value(&o.max_steps)->default_value(0),
      "stop after this many steps (0: none)")("train-samples",
                                              po::value(&o.train_samples)->default_value(0),
                                              "use the first N training samples")(
      "test-samples", po::value(&o.test_samples)->default_value(0), "use the first N test samples")(
      "no-eval", "skip the test-set evaluation")("step-timing-csv", po::value(&o.step_timing_csv),
                                                 "write per-step, per-ordinal timings")(
      "fail-at-step", po::value(&o.fail_at_step)->default_value(0),
      "fault injection: the last ordinal SIGKILLs itself before this step on attempt 0");
  return d;
}

void validate(TrainOptions& o, const po::variables_map& vm) {
  require(o.model == "mlp" || o.model == "cnn", "model", "mlp or cnn", "'" + o.model + "'");
  require(o.optimizer == "sgd" || o.optimizer == "adam" || o.optimizer == "adamw", "optimizer",
          "sgd, adam or adamw", "'" + o.optimizer + "'");
  require(o.schedule == "cosine" || o.schedule == "constant", "schedule", "cosine or constant",
          "'" + o.schedule + "'");
  const bool from_env = o.precision.empty();
  if (from_env) o.precision = env_string(kPrecisionEnv).value_or("f32");
  if (o.precision != "f32" && o.precision != "bf16") {
    throw InvalidArgument(fmt::format("{}: expected f32 or bf16, got '{}'",
                                      from_env ? kPrecisionEnv : "--precision", o.precision));
  }
  require(o.epochs >= 1 && o.epochs <= 100'000, "epochs", "1..100000", std::to_string(o.epochs));
  require(o.batch_size >= 1 && o.batch_size <= 65'536, "batch-size", "1..65536",
          std::to_string(o.batch_size));
  if (!vm.count("lr")) o.lr = o.optimizer == "sgd" ? 0.05 : 1e-3;
  require(o.lr > 0 && o.lr < 100, "lr", "a rate in (0, 100)", fmt::format("{}", o.lr));
  require(o.momentum >= 0 && o.momentum < 1, "momentum", "[0, 1)", fmt::format("{}", o.momentum));
  require(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "weight-decay", "a finite value >= 0",
          fmt::format("{}", o.weight_decay));
  for (auto [flag, v] : {std::pair{"checkpoint-every", o.checkpoint_every},
                         {"max-steps", o.max_steps},
                         {"train-samples", o.train_samples},
                         {"test-samples", o.test_samples},
                         {"fail-at-step", o.fail_at_step}}) {
    require(v >= 0, flag, "a count >= 0", std::to_string(v));
  }
  require(!vm.count("checkpoint") || !o.checkpoint.empty(), "checkpoint", "a path", "''");
  if (vm.count("data-dir") && !std::filesystem::is_directory(o.data_dir)) {
    throw InvalidArgument(fmt::format("--data-dir '{}': not a directory (the Fashion-MNIST files' "
                                      "directory)",
                                      o.data_dir));
  }
  require(!o.resume || !o.checkpoint.empty(), "resume", "--checkpoint PATH with it", "none");
  require(o.checkpoint_every == 0 || !o.checkpoint.empty(), "checkpoint-every",
          "--checkpoint PATH with it", "none");
  o.eval = !vm.count("no-eval");
}

}  // namespace

TrainOptions parse_train_options(int argc, const char* const* argv) {
  TrainOptions o;
  po::options_description d = describe(o);
  po::variables_map vm;
  if (std::optional<std::string> usage = examples::parse_command_line(argc, argv, d, vm)) {
    o.help = true;
    o.usage = *usage;
    return o;
  }
  validate(o, vm);
  return o;
}

}  // namespace xs::fmnist
