#include "xla_spawn/base/int_ranges.h"

#include <fmt/format.h>

namespace xs {

std::string format_int_ranges(const std::vector<int>& values) {
  std::string text;
  for (size_t i = 0; i < values.size();) {
    size_t j = i;
    while (j + 1 < values.size() && values[j + 1] == values[j] + 1) ++j;
    if (!text.empty()) text += ", ";
    text += j == i ? fmt::format("{}", values[i]) : fmt::format("{}-{}", values[i], values[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace xs
