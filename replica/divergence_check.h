#pragma once
// The replica-divergence check behind XLA_SPAWN_DEBUG_REPLICAS=1: after a step every replica
// sends the hash of the graph it ran and a hash of each parameter's bytes to the others; the
// first ordinal whose graph or parameters differ from the master's is named in the error.
//
//   xs::xm::check_replicas_identical(model.named_parameters(), step);   // PeerFailure if not
//
// Cheaper and always on in the trainers: check_finite_loss(loss, step) on the loss each step
// already reads back, since a NaN or an infinity in the parameters (a diverging run, or bytes
// scribbled over a buffer) reaches the loss within a step.

#include <cstdint>
#include <span>
#include <vector>

#include "xla_spawn/runtime/nn/module.h"

namespace xs::xm {

// FNV-1a over bytes (stable across processes and runs; not for security).
uint64_t hash_bytes(std::span<const uint8_t> bytes, uint64_t seed = 0xcbf29ce484222325ull);

// Hash of every parameter's bytes, in order (materialises pending values first).
std::vector<uint64_t> parameter_hashes(const NamedTensors& params);

// Collective: throws xs::PeerFailure naming the first ordinal (lowest) whose last graph hash
// or parameter hashes differ from ordinal 0's, the step, and the first differing parameter.
void check_replicas_identical(const NamedTensors& params, int64_t step);

// Throws xs::Error naming the step, the ordinal and the value when `loss` is NaN or infinite.
void check_finite_loss(double loss, int64_t step);

}  // namespace xs::xm
