#pragma once
// Sorted integers written the way people read them, runs collapsed: "0-3, 5, 7-8" for
// {0, 1, 2, 3, 5, 7, 8}. Ordinals in the launcher's summaries, nodes in the master's.
//
//   xs::format_int_ranges({0, 1, 2, 5});   // "0-2, 5"

#include <string>
#include <vector>

namespace xs {

// `values` sorted ascending; an empty list is "".
std::string format_int_ranges(const std::vector<int>& values);

}  // namespace xs
