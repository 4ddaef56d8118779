#pragma once
// Always-on checks (release builds too) whose message prints the values involved.
//
//   XS_CHECK(n_elems <= capacity, "staging overflow: {} > {}", n_elems, capacity);
//   XS_CHECK_EQ(a.size(), b.size(), "all_reduce operands");
//   XS_CHECK_ARG(world_size > 0, "world size {} must be positive", world_size);
//
// XS_CHECK and XS_CHECK_EQ throw xs::InternalError (a bug); XS_CHECK_ARG throws
// xs::InvalidArgument (the caller's input was wrong). A message is required.

#include <string>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"

namespace xs::detail {

[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               const std::string& message);
[[noreturn]] void arg_check_failed(const std::string& message);

}  // namespace xs::detail

#define XS_CHECK(cond, ...)                                                               \
  do {                                                                                    \
    if (!(cond)) [[unlikely]]                                                             \
      ::xs::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
  } while (0)

#define XS_CHECK_EQ(a, b, ...)                                                              \
  do {                                                                                      \
    const auto& xs_check_a_ = (a);                                                          \
    const auto& xs_check_b_ = (b);                                                          \
    if (!(xs_check_a_ == xs_check_b_)) [[unlikely]]                                         \
      ::xs::detail::check_failed(                                                           \
          __FILE__, __LINE__, #a " == " #b,                                                 \
          ::fmt::format("{}: {} != {}", ::fmt::format(__VA_ARGS__), xs_check_a_, xs_check_b_)); \
  } while (0)

#define XS_CHECK_ARG(cond, ...)                                             \
  do {                                                                      \
    if (!(cond)) [[unlikely]]                                               \
      ::xs::detail::arg_check_failed(::fmt::format(__VA_ARGS__));           \
  } while (0)
