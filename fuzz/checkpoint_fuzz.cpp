// libFuzzer entry point for the checkpoint parser (envelope, index, data bounds, round trip).
// Built and run by fuzz/run; the corpus is fuzz/corpus/checkpoint.
#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  xs::fuzz::checkpoint_one_input(data, size);
  return 0;
}
