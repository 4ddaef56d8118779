#include "xla_spawn/runtime/tensor.h"

#include <cstring>
#include <ostream>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/autocast.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs {

TensorImpl::TensorImpl(Runtime& rt) : runtime(&rt) { rt.register_tensor(this); }

TensorImpl::~TensorImpl() {
  if (runtime) runtime->unregister_tensor(this);
}

namespace {

std::shared_ptr<TensorImpl> new_impl(ValueType type) {
  auto impl = std::make_shared<TensorImpl>(runtime());
  impl->type = std::move(type);
  return impl;
}

}  // namespace

Tensor Tensor::from_ir(NodePtr node) {
  if (node->op == Op::kData) {
    check_data_current(*node);
    return from_buffer(node->data, node->type);
  }
  auto impl = new_impl(node->type);
  impl->node = std::move(node);
  return Tensor(std::move(impl));
}

Tensor Tensor::from_buffer(BufferPtr data, ValueType type) {
  const size_t need = ::xs::numel(type.shape) * dtype_size(type.dtype);
  if (data == nullptr || data->size_bytes() < need) {
    throw InvalidArgument(fmt::format("Tensor::from_buffer: {} needs {} bytes, buffer has {}", type_str(type),
                                      need, data ? data->size_bytes() : 0));
  }
  auto impl = new_impl(std::move(type));
  impl->data = std::move(data);
  return Tensor(std::move(impl));
}

template <typename T>
Tensor Tensor::from_vector(std::span<const T> values, Shape shape, DType dtype) {
  dtype = device_dtype(dtype);
  const int64_t n = ::xs::numel(shape);
  if (static_cast<int64_t>(values.size()) != n) {
    throw InvalidArgument(fmt::format("Tensor::from_vector: {} values for shape {} ({} elements)",
                                      values.size(), shape_str(shape), n));
  }
  BufferPtr buf = Buffer::allocate(n * dtype_size(dtype));
  if (n == 0) {
    // nothing to copy (an empty span's data() may be null)
  } else if (dtype == dtype_of<T>()) {
    std::memcpy(buf->data(), values.data(), n * sizeof(T));
  } else {
    for (int64_t i = 0; i < n; ++i) {
      double v;
      if constexpr (std::is_same_v<T, BF16>) v = values[i].to_float();
      else v = static_cast<double>(values[i]);
      store_element(buf->data(), dtype, i, v);
    }
  }
  runtime().metrics().increment(kCounterTransferToDevice);
  return from_buffer(std::move(buf), {std::move(shape), dtype});
}

template Tensor Tensor::from_vector<float>(std::span<const float>, Shape, DType);
template Tensor Tensor::from_vector<double>(std::span<const double>, Shape, DType);
template Tensor Tensor::from_vector<int32_t>(std::span<const int32_t>, Shape, DType);
template Tensor Tensor::from_vector<int64_t>(std::span<const int64_t>, Shape, DType);
template Tensor Tensor::from_vector<uint8_t>(std::span<const uint8_t>, Shape, DType);
template Tensor Tensor::from_vector<BF16>(std::span<const BF16>, Shape, DType);

Tensor Tensor::scalar(double value, DType dtype, SourceLoc loc) {
  detail::SiteScope scope(loc);
  dtype = device_dtype(dtype);
  if (value == 0 || value == 1) return from_ir(make_const(value, {{}, dtype}));
  BufferPtr buf = Buffer::allocate(dtype_size(dtype));
  store_element(buf->data(), dtype, 0, value);
  return from_buffer(std::move(buf), {{}, dtype});
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, SourceLoc loc) {
  detail::SiteScope scope(loc);
  dtype = device_dtype(dtype);
  if (value == 0 || value == 1) return from_ir(make_const(value, {shape, dtype}));
  Attrs a;
  a.ints = shape;
  return from_ir(make_node(Op::kBroadcast, {scalar(value, dtype).ir()}, std::move(a)));
}

Tensor Tensor::full_data(const Shape& shape, double value, DType dtype) {
  dtype = device_dtype(dtype);
  const int64_t n = ::xs::numel(shape);
  BufferPtr buf = Buffer::allocate(n * dtype_size(dtype));
  if (n > 0) {
    store_element(buf->data(), dtype, 0, value);
    const size_t sz = dtype_size(dtype);
    for (int64_t i = 1; i < n; ++i) std::memcpy(static_cast<char*>(buf->data()) + i * sz, buf->data(), sz);
  }
  runtime().metrics().increment(kCounterTransferToDevice);
  return from_buffer(std::move(buf), {shape, dtype});
}

TensorImpl& Tensor::checked(const char* what) const {
  if (!impl_) throw InvalidArgument(fmt::format("Tensor::{} on an undefined tensor", what));
  return *impl_;
}

bool Tensor::is_pending() const { return checked("is_pending").node != nullptr; }
const Shape& Tensor::shape() const { return checked("shape").type.shape; }
DType Tensor::dtype() const { return checked("dtype").type.dtype; }
const ValueType& Tensor::type() const { return checked("type").type; }

NodePtr Tensor::ir() const {
  TensorImpl& impl = checked("ir");
  if (impl.lost) throw InvalidArgument(*impl.lost);
  if (impl.node) return impl.node;
  if (!impl.leaf) impl.leaf = make_data(impl.data, impl.type);
  return impl.leaf;
}

void Tensor::force() const {
  TensorImpl& impl = checked("force");
  if (impl.lost) throw InvalidArgument(*impl.lost);
  if (!impl.node) return;
  if (impl.runtime == nullptr) throw InvalidArgument("Tensor: its runtime was destroyed before it was read");
  TensorImpl* p = &impl;
  impl.runtime->sync(std::span<TensorImpl* const>(&p, 1));
}

BufferPtr Tensor::buffer() const {
  force();
  return impl_->data;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  force();
  const TensorImpl& impl = *impl_;
  Runtime& rt = impl.runtime ? *impl.runtime : runtime();
  ScopedTimer timer(rt.metrics(), kTimerTransferFromDevice);
  rt.metrics().increment(kCounterTransferFromDevice);
  const int64_t n = numel();
  std::vector<T> out(n);
  if (n == 0) return out;
  if (impl.type.dtype == dtype_of<T>()) {
    std::memcpy(out.data(), impl.data->data(), n * sizeof(T));
    return out;
  }
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, BF16>) {
      out[i] = BF16::from_float(static_cast<float>(load_element(impl.data->data(), impl.type.dtype, i)));
    } else if constexpr (std::is_same_v<T, int64_t>) {
      out[i] = load_element_i64(impl.data->data(), impl.type.dtype, i);
    } else {
      out[i] = static_cast<T>(load_element(impl.data->data(), impl.type.dtype, i));
    }
  }
  return out;
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;
template std::vector<BF16> Tensor::to_vector<BF16>() const;

double Tensor::item() const {
  if (numel() != 1) {
    throw InvalidArgument(fmt::format("Tensor::item: tensor has {} elements ({}), expected 1", numel(),
                                      type_str(type())));
  }
  return to_vector<double>()[0];
}

void Tensor::assign(const Tensor& value) {
  TensorImpl& impl = checked("assign");
  impl.node = value.ir();
  impl.type = value.type();
  impl.lost = nullptr;
  // In-place semantics: the handle now holds value's history (none under no_grad).
  impl.grad_fn = value.impl_->grad_fn;
  if (impl.grad_fn) impl.requires_grad = true;
  impl.data = nullptr;
  impl.leaf = nullptr;
  if (impl.node->op == Op::kData) {  // assigning a materialised tensor: share its buffer
    impl.data = impl.node->data;
    impl.node = nullptr;
  }
}

bool Tensor::requires_grad() const { return checked("requires_grad").requires_grad; }

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  TensorImpl& impl = checked("set_requires_grad");
  if (impl.grad_fn) {
    throw InvalidArgument(fmt::format("set_requires_grad on a non-leaf {} (use detach() first)", type_str(impl.type)));
  }
  if (requires_grad && !is_float(impl.type.dtype)) {
    throw InvalidArgument(fmt::format("set_requires_grad: only floating tensors can require gradients, not {}",
                                      type_str(impl.type)));
  }
  impl.requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const { return checked("is_leaf").grad_fn == nullptr; }

Tensor Tensor::grad() const {
  const TensorImpl& impl = checked("grad");
  return impl.grad ? Tensor(impl.grad) : Tensor();
}

void Tensor::set_grad(const Tensor& grad) { checked("set_grad").grad = grad.impl_; }

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  const std::vector<double> v = t.to_vector<double>();
  os << "Tensor(" << type_str(t.type()) << ", [";
  for (size_t i = 0; i < v.size() && i < 64; ++i) os << (i ? ", " : "") << v[i];
  if (v.size() > 64) os << ", ...";
  return os << "])";
}

}  // namespace xs
