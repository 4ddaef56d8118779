// libFuzzer entry point for xla-spawn's command-line parser (split of options from the
// command, Boost.Program_options, value validation). Built and run by fuzz/run; the corpus is
// fuzz/corpus/spawn_options (argv pieces separated by NUL bytes).
#include "fuzz/spawn_options_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  xs::fuzz::spawn_options_one_input(data, size);
  return 0;
}
