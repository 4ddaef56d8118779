#pragma once
// Reassembles whole lines from the arbitrary chunks a pipe delivers, so output is only ever
// written line-whole. A line longer than the cap comes out in cap-sized pieces as it arrives,
// which keeps memory bounded when a replica writes megabytes without a newline; each piece
// says whether it starts and whether it ends its line, so a writer can still put the line
// back together.
//
//   xs::LineSplitter splitter;
//   std::vector<xs::LinePiece> lines;
//   splitter.feed("a\nb", lines);   // {"a"}; "b" waits for its newline
//   splitter.finish(lines);         // {"a"}, {"b"} (EOF flushes the partial line)

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace xs {

// 64 KiB: far above any sane log line, small enough that N replicas cannot exhaust memory.
inline constexpr size_t kMaxLineBytes = 64 * 1024;

// A whole line (both flags true) or a piece of one longer than the cap, without its '\n'.
struct LinePiece {
  std::string text;
  bool starts_line = true;  // false: it goes on from the previous piece
  bool ends_line = true;    // false: cut at the cap, the line goes on in the next piece

  bool operator==(const LinePiece&) const = default;
};

class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line_bytes = kMaxLineBytes);

  // Appends `bytes`; every line completed by them, and every cap-sized piece of a longer one,
  // is appended to `pieces`.
  void feed(std::string_view bytes, std::vector<LinePiece>& pieces);

  // End of stream: the pending partial line, if any, is appended to `pieces` as its end.
  void finish(std::vector<LinePiece>& pieces);

  bool has_partial() const { return !partial_.empty() || in_long_line_; }

 private:
  void emit(std::vector<LinePiece>& pieces, bool ends_line);

  size_t max_line_bytes_;
  std::string partial_;        // bytes after the last '\n' or cut; always < max_line_bytes_
  bool in_long_line_ = false;  // the last piece emitted was cut at the cap
};

}  // namespace xs
