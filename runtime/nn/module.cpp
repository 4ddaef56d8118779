#include "xla_spawn/runtime/nn/module.h"

#include <fmt/format.h>

#include "xla_spawn/base/error.h"

namespace xs {

void Module::collect(const std::string& prefix, bool parameters, NamedTensors& out) const {
  for (const auto& [name, t] : parameters ? parameters_ : buffers_)
    out.emplace_back(prefix + name, *t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", parameters, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, out);
  return out;
}

NamedTensors Module::named_state() const {
  NamedTensors out = named_parameters();
  for (auto& nt : named_buffers()) out.push_back(std::move(nt));
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

Tensor& Module::register_parameter(std::string name, Tensor t) {
  t.set_requires_grad(true);
  parameters_.emplace_back(std::move(name), std::make_unique<Tensor>(std::move(t)));
  return *parameters_.back().second;
}

Tensor& Module::register_buffer(std::string name, Tensor t) {
  buffers_.emplace_back(std::move(name), std::make_unique<Tensor>(std::move(t)));
  return *buffers_.back().second;
}

void Module::register_module(std::string name, std::shared_ptr<Module> child) {
  if (!child) throw InvalidArgument(fmt::format("Module::register_module: '{}' is null", name));
  children_.emplace_back(std::move(name), std::move(child));
}

}  // namespace xs
