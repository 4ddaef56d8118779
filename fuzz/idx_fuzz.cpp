// libFuzzer entry point for the IDX reader (gzip detection, inflate, header validation).
// Built and run by fuzz/run; the corpus is fuzz/corpus/idx.
#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  xs::fuzz::idx_one_input(data, size);
  return 0;
}
