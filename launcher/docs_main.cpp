// xla-spawn-docs: writes the man page and the bash completion from their templates, filling in
// the options from the table --help prints (option_docs()). Run by the build, not installed.
//
//   xla-spawn-docs man xla-spawn.1.in xla-spawn.1
//   xla-spawn-docs completion xla-spawn.bash-completion.in xla-spawn.bash-completion

#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "xla_spawn/launcher/options.h"

namespace {

// Text as troff prints it literally: backslashes doubled, hyphens as \- (so they are minus
// signs a reader can search for and copy), a leading dot or quote escaped.
std::string troff(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '-') {
      out += "\\-";
    } else {
      out += c;
    }
  }
  if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out.insert(0, "\\&");
  return out;
}

std::string man_options() {
  std::string out;
  for (const xs::OptionDoc& o : xs::option_docs()) {
    std::string head = fmt::format("\\fB\\-\\-{}\\fR", troff(o.long_name));
    if (o.short_name != 0) head = fmt::format("\\fB\\-{}\\fR, {}", o.short_name, head);
    if (!o.value_name.empty()) head += fmt::format(" \\fI{}\\fR", troff(o.value_name));
    out += fmt::format(".TP\n{}\n{}\n", head, troff(o.description));
  }
  return out;
}

// Every spelling of every option, and the ones that take a value as a `case` pattern.
std::string completion_words(bool valued_only) {
  std::string out;
  for (const xs::OptionDoc& o : xs::option_docs()) {
    if (valued_only && o.value_name.empty()) continue;
    const std::string separator = valued_only ? "|" : " ";
    if (o.short_name != 0) out += fmt::format("{}-{}", out.empty() ? "" : separator, o.short_name);
    out += fmt::format("{}--{}", out.empty() ? "" : separator, o.long_name);
  }
  return out;
}

void replace_all(std::string& text, const std::string& key, const std::string& value) {
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size())) {
    text.replace(at, key.size(), value);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 4) {
    fmt::print(stderr, "usage: xla-spawn-docs man|completion TEMPLATE OUTPUT\n");
    return 2;
  }
  const std::string kind = argv[1];
  std::ifstream in(argv[2]);
  if (!in) throw std::runtime_error(fmt::format("cannot read {}", argv[2]));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (kind == "man") {
    std::string version = xs::version_text();  // "xla-spawn X.Y.Z\n"
    version = version.substr(version.find(' ') + 1);
    version.pop_back();
    replace_all(text, "@VERSION@", version);
    replace_all(text, "@OPTIONS@\n", man_options());
  } else if (kind == "completion") {
    replace_all(text, "@OPTIONS@", completion_words(false));
    replace_all(text, "@VALUED@", completion_words(true));
  } else {
    throw std::runtime_error(fmt::format("unknown kind '{}' (man or completion)", kind));
  }
  std::ofstream out(argv[3]);
  out << text;
  out.close();
  if (!out) throw std::runtime_error(fmt::format("cannot write {}", argv[3]));
  return EXIT_SUCCESS;
} catch (const std::exception& e) {
  fmt::print(stderr, "xla-spawn-docs: {}\n", e.what());
  return EXIT_FAILURE;
}
