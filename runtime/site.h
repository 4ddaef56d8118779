#pragma once
// Recording sites: with XLA_SPAWN_IR_DEBUG=1 every IR node keeps the source line of the code
// that recorded it (as PyTorch/XLA's XLA_IR_DEBUG keeps Python frames), for the recompile
// explainer and the IR dumps. Off, nodes keep an empty site and recording pays one check.
//
//   Tensor relu(const Tensor& x, SourceLoc loc = SourceLoc::current());   // the caller's line
//   Tensor relu(const Tensor& x, SourceLoc loc) { detail::SiteScope scope(loc); ... record ... }
//
// The outermost op call wins: a composite (log_softmax) or a layer's ops (nn/linear.cpp) report
// the line that called the composite, or the layer's own line; never a line inside ops.cpp.
// Gradient ops report the line of the forward op they differentiate.

#include <source_location>
#include <string>

namespace xs {

using SourceLoc = std::source_location;

struct RecordSite {
  SourceLoc loc;          // line() == 0: not recorded (IR debug off, or made outside an op)
  bool backward = false;  // a gradient op: `loc` recorded the forward op it differentiates

  bool known() const { return loc.line() != 0; }
};

// "runtime/nn/linear.cpp:27" (paths under the project's source tree are shown relative to it),
// "gradient of tests/runtime/explain_test.cpp:40", or "" when not known.
std::string site_text(const RecordSite& site);

}  // namespace xs

namespace xs::detail {

// The site new IR nodes take on this thread (empty unless a SiteScope set one).
const RecordSite& current_site();

// Sets the current site for its lifetime when the current runtime has IR debug on. The plain
// form sets it only when none is set (the outermost op call wins); kOverride replaces it (the
// autograd walk: each gradient op reports its forward op's line) and restores it on exit.
class SiteScope {
 public:
  enum Mode { kOutermost, kOverride };
  explicit SiteScope(const SourceLoc& loc) : SiteScope(RecordSite{loc, false}, kOutermost) {}
  SiteScope(const RecordSite& site, Mode mode);
  ~SiteScope();
  SiteScope(const SiteScope&) = delete;
  SiteScope& operator=(const SiteScope&) = delete;

 private:
  RecordSite previous_;
  bool active_ = false;
};

}  // namespace xs::detail
