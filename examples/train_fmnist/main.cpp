// train_fmnist: trains an MLP or a CNN on Fashion-MNIST with the replica API, alone or as any
// number of replicas under xla-spawn, reporting test accuracy after each epoch.
//
//   xla-spawn -n 4 -- train_fmnist --model mlp --epochs 15 --batch-size 32 --checkpoint /tmp/m.ckpt
//   --resume

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "examples/train_fmnist/options.h"
#include "examples/train_fmnist/trainer.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/runtime/runtime.h"

int main(int argc, char** argv) try {
  const xs::fmnist::TrainOptions options = xs::fmnist::parse_train_options(argc, argv);
  if (options.help) {
    fmt::print("{}", options.usage);
    return EXIT_SUCCESS;
  }
  xs::xm::init();
  const xs::fmnist::TrainResult r = xs::fmnist::Trainer(options).run();
  const std::string accuracy =
      r.test_accuracy < 0 ? "not evaluated" : fmt::format("{:.4f}", r.test_accuracy);
  xs::xm::master_print(
      "done: {} steps, {} epochs, test accuracy {}, {:.0f} samples/s over {:.1f} s of training",
      r.steps, r.epochs_completed, accuracy, r.samples_per_second, r.train_seconds);
  if (options.metrics) xs::xm::master_print("{}", xs::metrics_report());
  xs::xm::shutdown();
  return EXIT_SUCCESS;
} catch (const xs::InvalidArgument& e) {
  fmt::print(stderr, "train_fmnist: {}\n", e.what());
  return 2;
} catch (const std::bad_alloc&) {
  fmt::print(stderr, "train_fmnist: out of memory\n");
  return EXIT_FAILURE;
} catch (const std::exception& e) {
  fmt::print(stderr, "train_fmnist: {}\n", e.what());
  return EXIT_FAILURE;
}
