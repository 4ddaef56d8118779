#pragma once
// Tensor: a cheap, shared handle to either materialised data (shape, dtype, 64-byte aligned
// buffer) or a pending IR value. Ops on tensors only record IR; mark_step() (or a host read
// such as to_vector/item/printing) compiles and runs what is pending.
//
//   Tensor x = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
//   Tensor y = relu(x * 0.5 + 1.0);          // recorded, not run
//   std::vector<float> v = y.to_vector<float>();   // forces y
//
// Not thread-safe: one runtime (and its tensors) per replica process.

#include <cstdint>
#include <iosfwd>
#include <list>
#include <memory>
#include <span>
#include <vector>

#include "xla_spawn/runtime/buffer.h"
#include "xla_spawn/runtime/element.h"
#include "xla_spawn/runtime/node.h"

namespace xs {

class Runtime;
struct AutogradNode;  // runtime/autograd.h

// Shared state behind Tensor handles. Registered with its runtime while alive, so
// mark_step() can find every live pending value.
struct TensorImpl {
  explicit TensorImpl(Runtime& runtime);
  ~TensorImpl();
  TensorImpl(const TensorImpl&) = delete;
  TensorImpl& operator=(const TensorImpl&) = delete;

  ValueType type;
  BufferPtr data;  // set when materialised
  NodePtr node;    // set when pending
  NodePtr leaf;    // kData node wrapping `data`, made on first use so uses share one leaf
  // Autograd: whether gradients flow to this tensor, its accumulated gradient (leaves), and
  // the recorded op that produced it (non-leaves; null for leaves and under no_grad).
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<AutogradNode> grad_fn;

  // Set when a step failed after it had begun to overwrite buffers this tensor's pending value
  // was computed from (donated inputs): the value cannot be recomputed, so using or reading
  // the tensor throws this message until a new value is assigned.
  std::shared_ptr<const std::string> lost;

  Runtime* runtime;  // null once the runtime is gone
  std::list<TensorImpl*>::iterator registry_pos;
};

class Tensor {
 public:
  Tensor() = default;  // undefined; most calls on it throw
  // A pending tensor holding `node` in the current runtime.
  static Tensor from_ir(NodePtr node);
  // A materialised tensor over `data` (size must match type).
  static Tensor from_buffer(BufferPtr data, ValueType type);
  // Copies `values` (converted to `dtype`) into a new materialised tensor.
  template <typename T>
  static Tensor from_vector(std::span<const T> values, Shape shape, DType dtype = dtype_of<T>());
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape, DType dtype = dtype_of<T>()) {
    return from_vector<T>(std::span<const T>(values), std::move(shape), dtype);
  }
  // A 0-d tensor. 0 and 1 are compile-time constants; any other value is a data input, so
  // a changing value (a learning rate) does not recompile. A constant made here records the
  // caller's line (runtime/site.h), as ops do.
  static Tensor scalar(double value, DType dtype = DType::kF32,
                       SourceLoc loc = SourceLoc::current());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::kF32,
                     SourceLoc loc = SourceLoc::current());
  // A materialised tensor filled on the host (no IR): for state a step will update
  // (optimizer buffers), so the first step traces the same graph as every later one.
  static Tensor full_data(const Shape& shape, double value, DType dtype = DType::kF32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32,
                      SourceLoc loc = SourceLoc::current()) {
    return full(shape, 0, dtype, loc);
  }
  static Tensor ones(const Shape& shape, DType dtype = DType::kF32,
                     SourceLoc loc = SourceLoc::current()) {
    return full(shape, 1, dtype, loc);
  }

  bool defined() const { return impl_ != nullptr; }
  bool is_pending() const;
  const Shape& shape() const;
  DType dtype() const;
  const ValueType& type() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t numel() const { return xs::numel(shape()); }

  // The IR value: the pending node, or a kData leaf over the buffer.
  NodePtr ir() const;
  // Host reads: run what this tensor needs (counted as an op outside the step graph).
  template <typename T>
  std::vector<T> to_vector() const;
  double item() const;
  // The materialised buffer (forces the tensor).
  BufferPtr buffer() const;

  // Makes this handle (and every copy of it) hold `value`'s IR, as an in-place update does;
  // the old buffer, if nothing else holds it, may then be overwritten by the step (aliasing).
  void assign(const Tensor& value);

  // Autograd (runtime/autograd.h). requires_grad is true for leaves marked so and for results
  // of ops on them recorded while gradients are enabled; set_requires_grad is for leaves.
  bool requires_grad() const;
  Tensor& set_requires_grad(bool requires_grad);
  bool is_leaf() const;
  Tensor grad() const;  // undefined until backward() reaches this leaf
  void set_grad(const Tensor& grad);  // an undefined `grad` clears it

  TensorImpl* impl() const { return impl_.get(); }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  TensorImpl& checked(const char* what) const;
  void force() const;
  std::shared_ptr<TensorImpl> impl_;
};

// Prints dtype, shape and (up to 64) values; forces the tensor.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace xs
