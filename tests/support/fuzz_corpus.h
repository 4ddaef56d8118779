#pragma once
// The fuzz targets' fixed corpus (fuzz/corpus/<target>/, written by fuzz/make_corpus.py), read
// for replay in CTest. File names say the expectation: ok-* must be accepted, bad-* rejected.
//
//   for (const auto& f : xs::testing::fuzz_corpus(XS_FUZZ_CORPUS_DIR, "idx")) run(f.bytes);

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace xs::testing {

struct CorpusFile {
  std::string name;
  std::vector<uint8_t> bytes;
  bool expected_ok() const { return name.starts_with("ok-"); }
};

inline std::vector<CorpusFile> fuzz_corpus(const std::filesystem::path& root,
                                           const std::string& target) {
  std::vector<CorpusFile> files;
  for (const auto& entry : std::filesystem::directory_iterator(root / target)) {
    std::ifstream in(entry.path(), std::ios::binary);
    files.push_back({entry.path().filename().string(),
                     {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()}});
  }
  return files;
}

}  // namespace xs::testing
