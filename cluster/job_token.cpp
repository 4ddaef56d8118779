#include "xla_spawn/cluster/job_token.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"

namespace xs::cluster {
namespace {

// Public constants that separate the derived keys; the secrecy is all in the token.
constexpr SipKey kDeriveA0{0x78732d746f6b656eULL, 0x2d612d302d6b6579ULL};
constexpr SipKey kDeriveA1{0x78732d746f6b656eULL, 0x2d612d312d6b6579ULL};
constexpr SipKey kDeriveB0{0x78732d746f6b656eULL, 0x2d622d302d6b6579ULL};
constexpr SipKey kDeriveB1{0x78732d746f6b656eULL, 0x2d622d312d6b6579ULL};

void put_le64(uint64_t x, uint8_t* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(x >> (8 * i));
}

std::string default_token_path() {
  if (auto config = env_string("XDG_CONFIG_HOME")) return *config + "/xla-spawn/job-token";
  std::optional<std::string> home = env_string("HOME");
  if (!home) {
    const passwd* pw = ::getpwuid(::getuid());
    if (pw == nullptr || pw->pw_dir == nullptr) {
      throw InvalidArgument(fmt::format(
          "job token: no HOME and no home directory for uid {}: set {}", ::getuid(), kJobTokenEnv));
    }
    home = pw->pw_dir;
  }
  return *home + "/.config/xla-spawn/job-token";
}

// The file's contents without a trailing newline; refuses files others may read or that are
// not ours, as ssh refuses a private key with loose permissions.
std::string read_token_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    // Missing or not ours to read: a bad setting (exit 2), not a failure of the system.
    const int error = errno;
    const std::string what = errno_message(fmt::format("job token file {}", path), error);
    if (error == ENOENT || error == EACCES || error == ELOOP || error == ENOTDIR) {
      throw InvalidArgument(what);
    }
    throw IoError(what);
  }
  struct stat st {};
  std::string text(kMaxTokenChars + 2, '\0');
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) n = ::read(fd, text.data(), text.size());
  const int read_errno = errno;
  ::close(fd);
  if (!S_ISREG(st.st_mode)) {
    throw InvalidArgument(fmt::format("job token file {} is not a regular file", path));
  }
  if (st.st_uid != ::getuid() || (st.st_mode & 077) != 0) {
    throw InvalidArgument(fmt::format(
        "job token file {} is owned by uid {} with mode {:04o}: it must be yours and private "
        "(chmod 600 {})",
        path, st.st_uid, st.st_mode & 07777, path));
  }
  if (n < 0) throw IoError(errno_message(fmt::format("job token file {}", path), read_errno));
  text.resize(static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

void make_private_dirs(const std::string& dir) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string prefix = dir.substr(0, slash);
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      throw IoError(errno_message(fmt::format("job token directory {}", prefix), errno));
    }
    if (slash == std::string::npos) return;
  }
}

// Writes a new token to `path` unless another process got there first: the token is written
// to a private temporary file that is then hard-linked into place, which fails with EEXIST
// rather than replacing a token other hosts may already use.
void create_token_file(const std::string& path) {
  const std::string dir = path.substr(0, path.rfind('/'));
  make_private_dirs(dir);
  const std::string temp = fmt::format("{}/.job-token.{}", dir, ::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw IoError(errno_message(fmt::format("job token file {}", temp), errno));
  const std::string text = random_token_text() + "\n";
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                       ::fsync(fd) == 0;
  const int write_errno = errno;
  ::close(fd);
  const int linked = written ? ::link(temp.c_str(), path.c_str()) : -1;
  const int link_errno = errno;
  ::unlink(temp.c_str());
  if (!written) throw IoError(errno_message(fmt::format("job token file {}", temp), write_errno));
  if (linked != 0 && link_errno != EEXIST) {
    throw IoError(errno_message(fmt::format("job token file {}", path), link_errno));
  }
}

}  // namespace

JobToken::JobToken(std::string_view text, std::string where) : text_(text), source_(std::move(where)) {
  if (text.size() < kMinTokenChars || text.size() > kMaxTokenChars) {
    throw InvalidArgument(fmt::format("job token from {}: {} characters, expected {}..{}", source_,
                                      text.size(), kMinTokenChars, kMaxTokenChars));
  }
  for (char c : text) {
    if (c < '!' || c > '~') {
      throw InvalidArgument(fmt::format(
          "job token from {}: expected printable ASCII without spaces, found byte 0x{:02x}",
          source_, static_cast<unsigned char>(c)));
    }
  }
  key_a_ = {siphash24(kDeriveA0, text.data(), text.size()),
            siphash24(kDeriveA1, text.data(), text.size())};
  key_b_ = {siphash24(kDeriveB0, text.data(), text.size()),
            siphash24(kDeriveB1, text.data(), text.size())};
}

JobToken JobToken::load() {
  if (auto text = env_string(kJobTokenEnv)) return JobToken(*text, kJobTokenEnv);
  if (auto path = env_string(kJobTokenFileEnv)) {
    try {  // the file must exist: only the default one is made on first use
      return JobToken(read_token_file(*path), *path);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("{}: {}", kJobTokenFileEnv, e.what()));
    }
  }
  const std::string path = default_token_path();
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) throw IoError(errno_message(fmt::format("job token file {}", path), errno));
    create_token_file(path);
  }
  return JobToken(read_token_file(path), path);
}

Mac JobToken::mac(std::string_view purpose, const Nonce& first, const Nonce& second) const {
  std::vector<uint8_t> message(purpose.begin(), purpose.end());
  message.push_back(0);
  message.insert(message.end(), first.begin(), first.end());
  message.insert(message.end(), second.begin(), second.end());
  Mac mac{};
  put_le64(siphash24(key_a_, message.data(), message.size()), mac.data());
  put_le64(siphash24(key_b_, message.data(), message.size()), mac.data() + 8);
  return mac;
}

Nonce random_nonce() {
  Nonce nonce{};
  size_t done = 0;
  while (done < nonce.size()) {
    const ssize_t n = ::getrandom(nonce.data() + done, nonce.size() - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw IoError(errno_message("getrandom", errno));
    done += static_cast<size_t>(n);
  }
  return nonce;
}

std::string random_token_text() {
  std::string text;
  for (uint8_t byte : random_nonce()) text += fmt::format("{:02x}", byte);
  return text;
}

bool mac_equal(const Mac& a, const Mac& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace xs::cluster
