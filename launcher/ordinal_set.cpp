#include "xla_spawn/launcher/ordinal_set.h"

#include <algorithm>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"

namespace xs {
namespace {

int parse_ordinal(std::string_view text, int world_size) {
  return static_cast<int>(parse_int(text, 0, world_size - 1, "--show-ordinals"));
}

}  // namespace

std::vector<bool> parse_ordinal_set(std::string_view text, int world_size) {
  if (text.empty()) throw InvalidArgument("--show-ordinals: expected ordinals like '0,2-3'");
  std::vector<bool> shown(static_cast<size_t>(world_size), false);
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    const size_t dash = item.find('-');
    const int first = parse_ordinal(item.substr(0, dash), world_size);
    const int last =
        dash == std::string_view::npos ? first : parse_ordinal(item.substr(dash + 1), world_size);
    if (last < first) {
      throw InvalidArgument(fmt::format("--show-ordinals item '{}': range is reversed", item));
    }
    for (int k = first; k <= last; ++k) shown[static_cast<size_t>(k)] = true;
    start = comma + 1;
  }
  return shown;
}

}  // namespace xs
