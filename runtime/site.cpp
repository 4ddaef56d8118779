#include "xla_spawn/runtime/site.h"

#include <string_view>

#include <fmt/format.h>

#include "xla_spawn/runtime/runtime.h"

namespace xs {
namespace {

// Per thread, like autograd's grad mode; one runtime records on one thread.
thread_local RecordSite g_site;

// The source tree's root as this file was compiled ("/src/xla-spawn/"), so sites in the tree
// print as "examples/train_fmnist/trainer.cpp:80". Empty when the path does not end as
// expected, or is relative already (the project's own build maps the root away with
// -ffile-prefix-map; a user's build may not).
std::string_view source_root() {
  static const std::string_view root = [] {
    constexpr std::string_view kSelf = "runtime/site.cpp";
    const std::string_view here = SourceLoc::current().file_name();
    return here.ends_with(kSelf) ? here.substr(0, here.size() - kSelf.size()) : std::string_view();
  }();
  return root;
}

}  // namespace

std::string site_text(const RecordSite& site) {
  if (!site.known()) return "";
  std::string_view file = site.loc.file_name();
  const std::string_view root = source_root();
  if (!root.empty() && file.starts_with(root)) file.remove_prefix(root.size());
  return fmt::format("{}{}:{}", site.backward ? "gradient of " : "", file, site.loc.line());
}

}  // namespace xs

namespace xs::detail {

const RecordSite& current_site() {
  return g_site;
}

SiteScope::SiteScope(const RecordSite& site, Mode mode) {
  if (!runtime().options().ir_debug) return;
  if (mode == kOutermost && g_site.known()) return;
  previous_ = g_site;
  g_site = site;
  active_ = true;
}

SiteScope::~SiteScope() {
  if (active_) g_site = previous_;
}

}  // namespace xs::detail
