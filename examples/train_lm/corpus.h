#pragma once
// The language model's text: a corpus of documents (one per line), its split into training and
// validation documents, and a character-level tokenizer whose alphabet is saved beside the
// checkpoint. The default corpus is the King James Bible from Debian's bible-kjv package, one
// verse per document with its reference stripped (about 31,000 verses, 4.1 MB, 75 characters).
//
//   const TextCorpus corpus = load_text_corpus("kjv");          // or a path to a text file
//   const CharTokenizer tok = CharTokenizer::from_documents(corpus.documents);
//   std::vector<int64_t> ids = tok.encode("In the beginning");

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace xs::lm {

struct TextCorpus {
  std::string source;                  // "kjv" or the file's path
  std::vector<std::string> documents;  // non-empty lines, without their newline
  int64_t bytes() const;
};

// The name that selects the KJV text (needs /usr/bin/bible from bible-kjv and bible-kjv-text).
inline constexpr std::string_view kKjvCorpus = "kjv";

// Reads `source` ("kjv" or a file). Throws InvalidArgument when it cannot be read, holds no
// text, or looks binary (a NUL byte, or more than 1% control bytes other than tab and CR).
TextCorpus load_text_corpus(const std::string& source);

// The last `fraction` of the text (whole documents, at least one) is validation.
struct CorpusSplit {
  std::vector<std::string> train, validation;
};
CorpusSplit split_corpus(const TextCorpus& corpus, double validation_fraction = 0.1);

// Byte-level alphabet of the corpus, sorted, always with '\n' (the document separator).
class CharTokenizer {
 public:
  explicit CharTokenizer(std::string alphabet);
  static CharTokenizer from_documents(const std::vector<std::string>& documents);
  // Throws InvalidArgument naming the first byte outside the alphabet and where it is.
  std::vector<int64_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int64_t>& ids) const;
  int64_t size() const { return static_cast<int64_t>(alphabet_.size()); }
  int64_t separator() const { return id_of_[static_cast<unsigned char>('\n')]; }
  const std::string& alphabet() const { return alphabet_; }
  // The alphabet as hex, for checkpoint metadata and the vocabulary file.
  std::string hex() const;
  static CharTokenizer from_hex(std::string_view hex);
  // Writes `path` atomically (the vocabulary file beside a checkpoint) / reads it back.
  void save(const std::string& path) const;
  static CharTokenizer load(const std::string& path);

 private:
  std::string alphabet_;
  int64_t id_of_[256];  // -1 outside the alphabet
};

}  // namespace xs::lm
