#pragma once
// The examples' command lines: Boost.Program_options errors and bad values become
// xs::InvalidArgument naming the flag (the binaries exit 2 on it), and --help yields the usage.
//
//   po::variables_map vm;
//   if (auto usage = xs::examples::parse_command_line(argc, argv, description, vm)) print(*usage);
//   xs::examples::require(lr > 0, "lr", "> 0", fmt::format("{}", lr));

#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <boost/program_options.hpp>

#include "xla_spawn/base/error.h"

namespace xs::examples {

// Fills `vm`; returns the usage text when --help was given (values are then not validated).
inline std::optional<std::string> parse_command_line(int argc, const char* const* argv,
                                                     const boost::program_options::options_description& d,
                                                     boost::program_options::variables_map& vm) {
  namespace po = boost::program_options;
  try {
    po::store(po::parse_command_line(argc, argv, d), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw InvalidArgument(fmt::format("{} (see --help)", e.what()));
  }
  if (!vm.count("help")) return std::nullopt;
  std::ostringstream out;
  out << d;
  return out.str();
}

inline void require(bool ok, std::string_view flag, std::string_view expected, const std::string& got) {
  if (!ok) throw InvalidArgument(fmt::format("--{}: expected {}, got {}", flag, expected, got));
}

}  // namespace xs::examples
