#include "bench/cluster/link_bytes.h"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"

namespace xs::bench {
namespace {

uint64_t read_counter(const std::filesystem::path& path) {
  std::ifstream in(path);
  uint64_t value = 0;
  if (!(in >> value)) throw IoError(fmt::format("cannot read a byte count from {}", path.string()));
  return value;
}

}  // namespace

std::optional<LinkBytes> read_link_bytes(const std::string& iface) {
  const std::filesystem::path stats =
      std::filesystem::path("/sys/class/net") / iface / "statistics";
  if (!std::filesystem::exists(stats)) return std::nullopt;
  return LinkBytes{read_counter(stats / "tx_bytes"), read_counter(stats / "rx_bytes")};
}

}  // namespace xs::bench
