#pragma once
// The two Fashion-MNIST models of train_fmnist, built from a seed (the same seed gives the
// same initial parameters everywhere; replicas still take the master's at start).
//
//   std::shared_ptr<xs::Module> model = xs::fmnist::make_model("cnn", seed);

#include <cstdint>
#include <memory>
#include <string_view>

#include "xla_spawn/runtime/nn/module.h"

namespace xs::fmnist {

// "mlp": Flatten, 784-512-512-10 with ReLU.
// "cnn": conv5x5(1->32, same) ReLU maxpool2, conv5x5(32->64, same) ReLU maxpool2, Flatten,
//        dense 3136-1024 ReLU, dropout 0.5, dense 1024-10 (the TensorFlow tutorial's CNN).
// Input [B, 1, 28, 28] f32, output logits [B, 10].
std::shared_ptr<Module> make_model(std::string_view name, uint64_t seed);

}  // namespace xs::fmnist
