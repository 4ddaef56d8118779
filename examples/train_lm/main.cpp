// train_lm: trains a character-level GPT on text (by default the King James Bible from Debian's
// bible-kjv) with the replica API, alone or as any number of replicas under xla-spawn,
// reporting validation loss in nats and bits per character and sampling text at the end.
//
//   xla-spawn -n 2 -- train_lm --steps 2000 --checkpoint /tmp/lm.ckpt --resume
//   train_lm --batching docs --buckets 32,64,128 --metrics

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "examples/train_lm/options.h"
#include "examples/train_lm/trainer.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/runtime/runtime.h"

int main(int argc, char** argv) try {
  const xs::lm::LmOptions options = xs::lm::parse_lm_options(argc, argv);
  if (options.help) {
    fmt::print("{}", options.usage);
    return EXIT_SUCCESS;
  }
  xs::xm::init();
  xs::lm::LmTrainer trainer(options);
  const xs::lm::LmResult r = trainer.run();
  if (!r.sample.empty()) xs::xm::master_print("sample (temperature {}):\n{}", options.temperature, r.sample);
  xs::xm::master_print("done: {} steps, validation loss {:.4f} nats/char, {:.0f} tokens/s over {:.1f} s of training",
                       r.steps, r.val_loss, r.tokens_per_second, r.train_seconds);
  if (options.metrics) xs::xm::master_print("{}", xs::metrics_report());
  xs::xm::shutdown();
  return EXIT_SUCCESS;
} catch (const xs::InvalidArgument& e) {
  fmt::print(stderr, "train_lm: {}\n", e.what());
  return 2;
} catch (const std::bad_alloc&) {
  fmt::print(stderr, "train_lm: out of memory (a smaller --d-model, --layers, --context or --batch-size needs less)\n");
  return EXIT_FAILURE;
} catch (const std::exception& e) {
  fmt::print(stderr, "train_lm: {}\n", e.what());
  return EXIT_FAILURE;
}
