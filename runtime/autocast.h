#pragma once
// Mixed precision. Two ways, as PyTorch/XLA offers them:
//  - Autocast: inside an AutocastGuard(DType::kBF16) scope, matmul and conv2d run in bf16
//    (f32 operands cast, f32 accumulation, the result rounded once to bf16); softmax,
//    log-softmax / log-sum-exp, layer norm, sums and means run in f32 (bf16 operands cast up);
//    any other op whose float operands differ in dtype takes the widest. Parameters stay f32
//    (the optimizer's master weights): their bf16 copies are casts in the step's graph, and
//    their gradients come back through those casts as f32. backward() runs without autocast.
//  - XLA_SPAWN_USE_BF16=1 (PyTorch/XLA's XLA_USE_BF16): every f32 tensor the program makes
//    is bf16 on the device (Tensor::dtype() says kBF16); host reads (to_vector<float>, item)
//    and checkpoints give f32, and an f32 checkpoint loads into it.
//
//   { xs::AutocastGuard bf16(xs::DType::kBF16);
//     loss = cross_entropy(model.forward(x), y); }   // matmuls bf16, the loss f32
//   backward(loss); xs::xm::optimizer_step(opt);      // update in f32

#include <optional>
#include <string>
#include <vector>

#include "xla_spawn/base/dtype.h"
#include "xla_spawn/runtime/op.h"
#include "xla_spawn/runtime/tensor.h"

namespace xs {

// Sets the thread's autocast dtype for its lifetime and restores the previous one after.
// kBF16 turns autocast on; kF32 turns it off (e.g. around a part that must stay f32).
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<DType> previous_;
};

// The thread's autocast dtype (kBF16), or nullopt when autocast is off.
std::optional<DType> autocast_dtype();

// What runs bf16 products and convolutions here, for logs: "oneDNN, native bf16 dot
// products", "oneDNN, bf16 emulated" or "widened to f32: convert + sgemm"
// (XLA_SPAWN_BF16_ENGINE, runtime/kernels/onednn.h).
std::string bf16_engine();

inline constexpr const char* kUseBF16Env = "XLA_SPAWN_USE_BF16";
// XLA_SPAWN_USE_BF16 (read once, default off).
bool use_bf16();
// The dtype a tensor made as `dtype` has on the device: kBF16 for kF32 under
// XLA_SPAWN_USE_BF16, else `dtype`.
DType device_dtype(DType dtype);

namespace detail {

// Applies the precision policy (autocast, XLA_SPAWN_USE_BF16) to an op about to be recorded:
// some operands replaced by casts, an f32 result dtype in `attrs` made bf16 under
// XLA_SPAWN_USE_BF16. Called by record(); does nothing when neither is on.
void apply_precision(Op op, std::vector<Tensor>& operands, Attrs& attrs);
// Whether apply_precision could change anything (cheap: a thread-local and a cached flag).
inline bool precision_policy_on() { return use_bf16() || autocast_dtype().has_value(); }
// `x` cast to f32 when autocast is on and `x` is bf16 (composites that must run in f32:
// log_softmax, logsumexp, the losses), else `x`.
Tensor autocast_to_f32(const Tensor& x);
// `b` cast to `like`'s float dtype when they differ (a layer's bias added to a product that
// autocast ran in bf16, as PyTorch's addmm casts it), else `b`.
Tensor bias_like(const Tensor& b, const Tensor& like);

}  // namespace detail
}  // namespace xs
