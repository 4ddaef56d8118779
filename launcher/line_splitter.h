#pragma once
// Reassembles whole lines from the arbitrary chunks a pipe delivers, so output is only ever
// written line-whole. A line longer than the cap is cut into cap-sized pieces, which keeps
// memory bounded when a replica writes megabytes without a newline.
//
//   xs::LineSplitter splitter;
//   std::vector<std::string> lines;
//   splitter.feed("a\nb", lines);   // lines == {"a"}; "b" waits for its newline
//   splitter.finish(lines);         // lines == {"a", "b"} (EOF flushes the partial line)

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace xs {

// 64 KiB: far above any sane log line, small enough that N replicas cannot exhaust memory.
inline constexpr size_t kMaxLineBytes = 64 * 1024;

class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line_bytes = kMaxLineBytes);

  // Appends `bytes`; every line completed by them is appended to `lines` without its '\n'.
  void feed(std::string_view bytes, std::vector<std::string>& lines);

  // End of stream: a pending partial line, if any, is appended to `lines`.
  void finish(std::vector<std::string>& lines);

  bool has_partial() const { return !partial_.empty(); }

 private:
  size_t max_line_bytes_;
  std::string partial_;  // bytes after the last '\n' seen; always < max_line_bytes_
};

}  // namespace xs
