// libFuzzer entry point for the rendezvous protocol's decoder and the master's coordinator.
// Built and run by fuzz/run; the corpus is fuzz/corpus/rendezvous.
#include "fuzz/rendezvous_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  xs::fuzz::rendezvous_one_input(data, size);
  return 0;
}
