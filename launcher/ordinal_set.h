#pragma once
// A set of ordinals written the way people type them: "0,2-3" (--show-ordinals).
//
//   std::vector<bool> shown = xs::parse_ordinal_set("0,2-3", /*world_size=*/4);
//   // shown == {true, false, true, true}

#include <string_view>
#include <vector>

namespace xs {

// Parses comma-separated ordinals and inclusive ranges "a-b", each in [0, world_size).
// Throws xs::InvalidArgument naming the offending item and the valid range.
std::vector<bool> parse_ordinal_set(std::string_view text, int world_size);

}  // namespace xs
