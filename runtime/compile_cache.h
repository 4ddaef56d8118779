#pragma once
// LRU cache of compiled programs keyed by graph hash. Capacity comes from
// XLA_SPAWN_COMPILE_CACHE_SIZE (RuntimeOptions); the least recently used program is evicted.
//
//   CompileCache cache(64);
//   if (auto p = cache.find(hash)) ...; else cache.insert(hash, compile_graph(g));

#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <utility>

#include "xla_spawn/runtime/program.h"

namespace xs {

class CompileCache {
 public:
  explicit CompileCache(size_t capacity) : capacity_(capacity) {}

  // The program for `hash` (marked most recently used), or null.
  std::shared_ptr<Program> find(uint64_t hash) {
    auto it = index_.find(hash);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }

  void insert(uint64_t hash, std::shared_ptr<Program> program) {
    if (auto it = index_.find(hash); it != index_.end()) {
      it->second->second = std::move(program);
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    order_.emplace_front(hash, std::move(program));
    index_.emplace(hash, order_.begin());
    while (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

  size_t size() const { return order_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  std::list<std::pair<uint64_t, std::shared_ptr<Program>>> order_;  // most recent first
  std::unordered_map<uint64_t, std::list<std::pair<uint64_t, std::shared_ptr<Program>>>::iterator> index_;
};

}  // namespace xs
