#pragma once
// RAII guard for environment variables in tests: sets (or unsets) a variable and restores
// its previous value when the guard goes out of scope, so tests never leak state.
//
//   xs::testing::ScopedEnv world("XLA_SPAWN_WORLD_SIZE", "4");
//   xs::testing::ScopedEnv unset("RANK", std::nullopt);

#include <cstdlib>
#include <optional>
#include <string>

namespace xs::testing {

class ScopedEnv {
 public:
  ScopedEnv(std::string name, std::optional<std::string> value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value) {
      ::setenv(name_.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace xs::testing
