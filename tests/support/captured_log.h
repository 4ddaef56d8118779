#pragma once
// Routes spdlog's default logger to a string for the guard's lifetime, so a test can assert
// on a warning's text.
//
//   xs::testing::CapturedLog log;
//   run_something_that_warns();
//   EXPECT_NE(log.text().find("recompiled"), std::string::npos);

#include <memory>
#include <sstream>
#include <string>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

namespace xs::testing {

class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace xs::testing
