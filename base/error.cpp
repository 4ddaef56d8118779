#include "xla_spawn/base/error.h"

#include <cstring>

#include <fmt/format.h>

namespace xs {

std::string errno_message(const std::string& what, int errno_value) {
  return fmt::format("{}: {} (errno {})", what, std::strerror(errno_value), errno_value);
}

}  // namespace xs
