#include "xla_spawn/cluster/store_table.h"

#include <fmt/format.h>

namespace xs::cluster {

std::optional<std::string> StoreTable::set(const std::string& key, std::vector<char> value) {
  auto it = values_.find(key);
  const size_t old_bytes = it == values_.end() ? 0 : key.size() + it->second.size();
  const size_t new_bytes = key.size() + value.size();
  if (bytes_ - old_bytes + new_bytes > max_bytes_) {
    return fmt::format("store: setting '{}' ({} bytes) would exceed the store's {} bytes", key,
                       value.size(), max_bytes_);
  }
  bytes_ = bytes_ - old_bytes + new_bytes;
  values_[key] = std::move(value);
  return std::nullopt;
}

const std::vector<char>* StoreTable::find(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

std::optional<std::string> StoreTable::first_missing(const std::vector<std::string>& keys) const {
  for (const std::string& key : keys) {
    if (!values_.contains(key)) return key;
  }
  return std::nullopt;
}

void StoreTable::clear() {
  values_.clear();
  bytes_ = 0;
}

}  // namespace xs::cluster
