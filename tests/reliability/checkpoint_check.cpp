// checkpoint_check: loads a checkpoint file with the project's validating loader and says
// whether it is intact. Used by scripts/fault-inject and the reliability tests to prove that
// the last completed checkpoint survived a fault.
//
//   checkpoint_check /ckpt/model.xsckpt   ->  "ok global_step=6 tensors=18 bytes=8037232", exit 0
//                                          ->  "missing ..." exit 3, "damaged: <why>" exit 1

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "xla_spawn/replica/checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_check FILE\n");
    return 2;
  }
  const std::string path = argv[1];
  if (!std::filesystem::exists(path)) {
    std::printf("missing %s\n", path.c_str());
    return 3;
  }
  try {
    const xs::Checkpoint ckpt = xs::load_checkpoint(path);
    size_t bytes = 0;
    for (const xs::HostTensor& t : ckpt.tensors) bytes += t.bytes.size();
    const auto step = ckpt.metadata.find("global_step");
    const long long global_step =
        step != ckpt.metadata.end() && std::holds_alternative<int64_t>(step->second)
            ? static_cast<long long>(std::get<int64_t>(step->second))
            : -1;
    std::printf("ok global_step=%lld tensors=%zu bytes=%zu\n", global_step, ckpt.tensors.size(),
                bytes);
    return 0;
  } catch (const std::exception& e) {
    std::printf("damaged: %s\n", e.what());
    return 1;
  }
}
