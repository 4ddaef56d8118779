#pragma once
// The examples' command lines: Boost.Program_options errors and bad values become
// xs::InvalidArgument naming the flag (the binaries exit 2 on it), and --help yields the usage.
//
//   po::variables_map vm;
//   if (auto usage = xs::examples::parse_command_line(argc, argv, description, vm)) print(*usage);
//   xs::examples::require(lr > 0, "lr", "> 0", fmt::format("{}", lr));

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <typeinfo>

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
    // No positional options: a stray word (`--epochs 3 5`) is an error, not ignored.
    const po::parsed_options parsed = po::command_line_parser(argc, argv)
                                          .options(d)
                                          .positional(po::positional_options_description{})
                                          .run();
    po::store(parsed, vm);
    po::notify(vm);
    // Boost reads "-1" into an unsigned option as 2^64 - 1.
    for (const po::option& o : parsed.options) {
      if (!vm.count(o.string_key) || o.value.empty()) continue;
      const std::type_info& type = vm[o.string_key].value().type();
      const bool is_unsigned = type == typeid(uint64_t) || type == typeid(uint32_t) ||
                               type == typeid(unsigned long long);
      if (is_unsigned && o.value.front().find('-') != std::string::npos) {
        throw InvalidArgument(fmt::format("--{}: expected an integer >= 0, got {}", o.string_key,
                                          o.value.front()));
      }
    }
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
