#include "xla_spawn/base/check.h"

namespace xs::detail {

void check_failed(const char* file, int line, const char* condition, const std::string& message) {
  throw InternalError(fmt::format("{} (check '{}' failed at {}:{})", message, condition, file, line));
}

void arg_check_failed(const std::string& message) { throw InvalidArgument(message); }

}  // namespace xs::detail
