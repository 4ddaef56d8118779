#include "examples/train_fmnist/models.h"

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/nn/activation.h"
#include "xla_spawn/runtime/nn/conv2d.h"
#include "xla_spawn/runtime/nn/dropout.h"
#include "xla_spawn/runtime/nn/linear.h"
#include "xla_spawn/runtime/nn/sequential.h"

namespace xs::fmnist {
namespace {

std::shared_ptr<Module> make_mlp(Generator& gen) {
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Flatten>(), std::make_shared<Linear>(784, 512, gen),
      std::make_shared<ReLU>(), std::make_shared<Linear>(512, 512, gen), std::make_shared<ReLU>(),
      std::make_shared<Linear>(512, 10, gen)});
}

std::shared_ptr<Module> make_cnn(Generator& gen) {
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(1, 32, 5, gen, 1, 2), std::make_shared<ReLU>(),
      std::make_shared<MaxPool2d>(2), std::make_shared<Conv2d>(32, 64, 5, gen, 1, 2),
      std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2), std::make_shared<Flatten>(),
      std::make_shared<Linear>(7 * 7 * 64, 1024, gen), std::make_shared<ReLU>(),
      std::make_shared<Dropout>(0.5), std::make_shared<Linear>(1024, 10, gen)});
}

}  // namespace

std::shared_ptr<Module> make_model(std::string_view name, uint64_t seed) {
  Generator gen(seed);
  if (name == "mlp") return make_mlp(gen);
  if (name == "cnn") return make_cnn(gen);
  throw InvalidArgument(fmt::format("make_model: unknown model '{}' (expected mlp or cnn)", name));
}

}  // namespace xs::fmnist
