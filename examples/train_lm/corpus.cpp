#include "examples/train_lm/corpus.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/detail/atomic_file.h"
#include "xla_spawn/replica/detail/file_bytes.h"

namespace xs::lm {
namespace {

constexpr const char* kBible = "/usr/bin/bible";
// The whole book: Genesis 1:1 to Revelation 22:21, one verse a line, "Ge1:1 In the beginning".
constexpr const char* kKjvCommand = "/usr/bin/bible -f 'Gen1:1-Rev22:21' 2>/dev/null";
constexpr size_t kMaxCorpusBytes = size_t{1} << 30;  // 1 GiB: far above any text this trains on

std::string kjv_text() {
  if (!std::filesystem::exists(kBible)) {
    throw InvalidArgument(fmt::format(
        "corpus '{}' needs {} (apt-get install bible-kjv bible-kjv-text), or pass --corpus FILE",
        kKjvCorpus, kBible));
  }
  FILE* pipe = popen(kKjvCommand, "r");
  if (pipe == nullptr) throw IoError(errno_message("running " + std::string(kBible), errno));
  std::string text;
  char buf[1 << 16];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) text.append(buf, n);
  const int status = pclose(pipe);
  if (status != 0 || text.empty()) {
    throw IoError(fmt::format("{} exited with status {} after {} bytes: is bible-kjv-text installed?",
                              kKjvCommand, WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.size()));
  }
  return text;
}

// Lines of `text` without empty ones; for the KJV, each verse without its "Ge1:1 " reference.
std::vector<std::string> documents_of(std::string_view text, bool strip_reference) {
  std::vector<std::string> docs;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (strip_reference) {
      const size_t space = line.find(' ');
      line = space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
    }
    if (!line.empty()) docs.emplace_back(line);
  }
  return docs;
}

void check_not_binary(std::string_view text, const std::string& source) {
  size_t control = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == 0) {
      throw InvalidArgument(
          fmt::format("corpus {}: a NUL byte at offset {}: this looks like a binary file, not text", source, i));
    }
    control += c < 0x20 && c != '\n' && c != '\t' && c != '\r';
  }
  if (control * 100 > text.size()) {
    throw InvalidArgument(fmt::format(
        "corpus {}: {} of {} bytes are control characters: this looks like a binary file, not text", source,
        control, text.size()));
  }
}

}  // namespace

int64_t TextCorpus::bytes() const {
  int64_t n = 0;
  for (const std::string& d : documents) n += static_cast<int64_t>(d.size()) + 1;
  return n;
}

TextCorpus load_text_corpus(const std::string& source) {
  const bool kjv = source == kKjvCorpus;
  std::string text;
  if (kjv) {
    text = kjv_text();
  } else {
    const std::vector<uint8_t> raw = detail::read_file_bytes(source, "corpus", kMaxCorpusBytes);
    text.assign(raw.begin(), raw.end());
  }
  check_not_binary(text, source);
  TextCorpus corpus{source, documents_of(text, kjv)};
  if (corpus.documents.empty()) {
    throw InvalidArgument(fmt::format("corpus {}: no text (every line is empty)", source));
  }
  return corpus;
}

CorpusSplit split_corpus(const TextCorpus& corpus, double validation_fraction) {
  if (!(validation_fraction > 0 && validation_fraction < 1)) {
    throw InvalidArgument(fmt::format("split_corpus: validation fraction {} (0..1)", validation_fraction));
  }
  if (corpus.documents.size() < 2) {
    throw InvalidArgument(fmt::format("corpus {}: {} document(s); a training and a validation split need 2",
                                      corpus.source, corpus.documents.size()));
  }
  const auto target = static_cast<int64_t>(static_cast<double>(corpus.bytes()) * validation_fraction);
  size_t first = corpus.documents.size() - 1;
  for (int64_t held = static_cast<int64_t>(corpus.documents.back().size()) + 1; first > 1 && held < target;) {
    --first;
    held += static_cast<int64_t>(corpus.documents[first].size()) + 1;
  }
  CorpusSplit split;
  split.train.assign(corpus.documents.begin(), corpus.documents.begin() + static_cast<ptrdiff_t>(first));
  split.validation.assign(corpus.documents.begin() + static_cast<ptrdiff_t>(first), corpus.documents.end());
  return split;
}

CharTokenizer::CharTokenizer(std::string alphabet) : alphabet_(std::move(alphabet)) {
  std::fill(std::begin(id_of_), std::end(id_of_), -1);
  for (size_t i = 0; i < alphabet_.size(); ++i) {
    int64_t& id = id_of_[static_cast<unsigned char>(alphabet_[i])];
    if (id >= 0) throw InvalidArgument(fmt::format("CharTokenizer: byte {:#04x} twice in the alphabet", alphabet_[i]));
    id = static_cast<int64_t>(i);
  }
  if (id_of_[static_cast<unsigned char>('\n')] < 0) {
    throw InvalidArgument("CharTokenizer: the alphabet must hold '\\n', the document separator");
  }
}

CharTokenizer CharTokenizer::from_documents(const std::vector<std::string>& documents) {
  bool seen[256] = {};
  seen[static_cast<unsigned char>('\n')] = true;
  for (const std::string& d : documents) {
    for (char c : d) seen[static_cast<unsigned char>(c)] = true;
  }
  std::string alphabet;
  for (int c = 0; c < 256; ++c) {
    if (seen[c]) alphabet.push_back(static_cast<char>(c));
  }
  return CharTokenizer(alphabet);
}

std::vector<int64_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    ids[i] = id_of_[static_cast<unsigned char>(text[i])];
    if (ids[i] < 0) {
      throw InvalidArgument(fmt::format("tokenizer: byte {:#04x} at offset {} is not in the {}-character alphabet",
                                        static_cast<unsigned char>(text[i]), i, alphabet_.size()));
    }
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  for (int64_t id : ids) {
    XS_CHECK(id >= 0 && id < size(), "decode: id {} outside the {}-character alphabet", id, size());
    text.push_back(alphabet_[static_cast<size_t>(id)]);
  }
  return text;
}

std::string CharTokenizer::hex() const {
  std::string out;
  for (char c : alphabet_) out += fmt::format("{:02x}", static_cast<unsigned char>(c));
  return out;
}

CharTokenizer CharTokenizer::from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0 || hex.find_first_not_of("0123456789abcdef") != std::string_view::npos) {
    throw InvalidArgument(fmt::format("vocabulary: '{}' is not lower-case hex byte pairs", hex.substr(0, 40)));
  }
  std::string alphabet;
  for (size_t i = 0; i < hex.size(); i += 2) {
    alphabet.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return CharTokenizer(alphabet);
}

void CharTokenizer::save(const std::string& path) const {
  detail::AtomicFileWriter out(path, "vocabulary");
  const std::string line = hex() + "\n";
  out.write(std::span(reinterpret_cast<const uint8_t*>(line.data()), line.size()));
  out.commit();
}

CharTokenizer CharTokenizer::load(const std::string& path) {
  const std::vector<uint8_t> raw = detail::read_file_bytes(path, "vocabulary", 4096);
  std::string_view text(reinterpret_cast<const char*>(raw.data()), raw.size());
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  return from_hex(text);
}

}  // namespace xs::lm
