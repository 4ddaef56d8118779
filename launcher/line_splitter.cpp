#include "xla_spawn/launcher/line_splitter.h"

#include "xla_spawn/base/check.h"

namespace xs {

LineSplitter::LineSplitter(size_t max_line_bytes) : max_line_bytes_(max_line_bytes) {
  XS_CHECK_ARG(max_line_bytes > 0, "LineSplitter: max_line_bytes must be positive, got {}",
               max_line_bytes);
}

void LineSplitter::feed(std::string_view bytes, std::vector<LinePiece>& pieces) {
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    const size_t room = max_line_bytes_ - partial_.size();
    if (newline != std::string_view::npos && newline <= room) {
      partial_.append(bytes.substr(0, newline));
      emit(pieces, /*ends_line=*/true);
      bytes.remove_prefix(newline + 1);
    } else if (bytes.size() < room) {
      partial_.append(bytes);
      return;
    } else {  // the cap is reached before a newline: emit a piece
      partial_.append(bytes.substr(0, room));
      emit(pieces, /*ends_line=*/false);
      bytes.remove_prefix(room);
    }
  }
}

void LineSplitter::finish(std::vector<LinePiece>& pieces) {
  // A line cut exactly at the cap still needs its end.
  if (!partial_.empty() || in_long_line_) emit(pieces, /*ends_line=*/true);
}

void LineSplitter::emit(std::vector<LinePiece>& pieces, bool ends_line) {
  pieces.push_back({std::move(partial_), !in_long_line_, ends_line});
  partial_.clear();
  in_long_line_ = !ends_line;
}

}  // namespace xs
