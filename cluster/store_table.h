#pragma once
// The key-value table behind the rendezvous server's store role (what gloo's
// rendezvous::Store calls reach): values of at most kMaxValueBytes and a byte budget for the
// whole table, so a client cannot exhaust the master's memory.
//
//   xs::cluster::StoreTable table(256 << 20);
//   if (auto error = table.set("rank_0", bytes)) reply(*error);
//   if (table.has_all({"0", "1"})) ...

#include <cstddef>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace xs::cluster {

class StoreTable {
 public:
  explicit StoreTable(size_t max_bytes) : max_bytes_(max_bytes) {}
  // Sets or replaces; the error text when the table would exceed its budget.
  std::optional<std::string> set(const std::string& key, std::vector<char> value);
  const std::vector<char>* find(const std::string& key) const;
  bool has_all(const std::vector<std::string>& keys) const { return !first_missing(keys); }
  // The first of `keys` that is not set.
  std::optional<std::string> first_missing(const std::vector<std::string>& keys) const;
  void clear();
  size_t bytes() const { return bytes_; }

 private:
  size_t max_bytes_;
  size_t bytes_ = 0;  // keys plus values
  std::unordered_map<std::string, std::vector<char>> values_;
};

}  // namespace xs::cluster
