#include "xla_spawn/runtime/nn/init.h"

#include <cmath>
#include <numbers>
#include <vector>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"

namespace xs {

Tensor uniform_tensor(const Shape& shape, double lo, double hi, Generator& gen) {
  std::vector<float> v(numel(shape));
  for (float& x : v) x = static_cast<float>(gen.uniform(lo, hi));
  return Tensor::from_vector<float>(v, shape);
}

Tensor normal_tensor(const Shape& shape, double mean, double std, Generator& gen) {
  std::vector<float> v(numel(shape));
  for (float& x : v) {
    const double u1 = 1.0 - gen.uniform(0, 1), u2 = gen.uniform(0, 1);
    x = static_cast<float>(mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
  }
  return Tensor::from_vector<float>(v, shape);
}

Tensor kaiming_uniform(const Shape& shape, int64_t fan_in, Generator& gen, double a) {
  if (fan_in <= 0)
    throw InvalidArgument(
        fmt::format("kaiming_uniform: fan_in {} for shape {}", fan_in, shape_str(shape)));
  const double bound = std::sqrt(2.0 / (1 + a * a)) * std::sqrt(3.0 / static_cast<double>(fan_in));
  return uniform_tensor(shape, -bound, bound, gen);
}

Tensor xavier_uniform(const Shape& shape, int64_t fan_in, int64_t fan_out, Generator& gen,
                      double gain) {
  if (fan_in + fan_out <= 0)
    throw InvalidArgument(fmt::format("xavier_uniform: no fan for shape {}", shape_str(shape)));
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_tensor(shape, -bound, bound, gen);
}

}  // namespace xs
