// libFuzzer entry point for the replica's environment parsing (ReplicaContext::from_env,
// parse_int, env_bool). Built and run by fuzz/run; the corpus is fuzz/corpus/replica_env
// (the variables' values separated by NUL bytes, in fuzz/replica_env_target.h's order).
#include "fuzz/replica_env_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  xs::fuzz::replica_env_one_input(data, size);
  return 0;
}
