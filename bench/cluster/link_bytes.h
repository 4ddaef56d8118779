#pragma once
// Bytes a network interface has sent and received, from the kernel's counters in
// /sys/class/net/<iface>/statistics, which show the interfaces of this process's network
// namespace (in a host of scripts/cluster: that host's eth0). Frame bytes: payload plus the
// TCP, IP and Ethernet headers, and the ACKs.
//
//   const auto before = xs::bench::read_link_bytes("eth0");   // nullopt: no such interface
//   ...; const auto after = xs::bench::read_link_bytes("eth0");
#include <cstdint>
#include <optional>
#include <string>

namespace xs::bench {

struct LinkBytes {
  uint64_t tx = 0;
  uint64_t rx = 0;
};

// nullopt when the interface does not exist (loopback-only runs); throws xs::IoError when its
// counters exist but cannot be read as numbers.
std::optional<LinkBytes> read_link_bytes(const std::string& iface);

}  // namespace xs::bench
