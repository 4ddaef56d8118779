#include "xla_spawn/base/io.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace xs {
namespace {

// A pipe closed on destruction.
struct Pipe {
  Pipe() { EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0); }
  ~Pipe() {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  int fds[2] = {-1, -1};
};

// Bytes derived from their index, so a lost or repeated chunk shows.
std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + i / 4096) & 0xFF);
  return s;
}

std::string read_to_end(int fd) {
  std::string got;
  char buffer[8192];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;)
    got.append(buffer, static_cast<size_t>(n));
  return got;
}

TEST(WriteAll, WritesMoreThanAPipeHoldsWhileTheReaderDrainsIt) {
  for (const size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{1} << 20}) {
    Pipe p;
    const std::string data = pattern(n);
    std::string got;
    std::thread reader([&] { got = read_to_end(p.fds[0]); });
    EXPECT_TRUE(write_all(p.fds[1], data)) << n << " bytes";
    ::close(p.fds[1]);
    p.fds[1] = -1;
    reader.join();
    EXPECT_EQ(got, data) << n << " bytes";
  }
}

TEST(WriteAll, WaitsForRoomOnAFullNonBlockingDescriptor) {
  Pipe p;
  ASSERT_EQ(::fcntl(p.fds[1], F_SETFL, O_NONBLOCK), 0);
  const std::string data = pattern(size_t{1} << 20);  // 16 times a default pipe's capacity
  std::string got;
  std::thread reader([&] { got = read_to_end(p.fds[0]); });
  EXPECT_TRUE(write_all(p.fds[1], data));
  ::close(p.fds[1]);
  p.fds[1] = -1;
  reader.join();
  EXPECT_EQ(got, data);
}

TEST(WriteAll, AFullDiskIsFalseWithEnospc) {
  const int fd = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << "no /dev/full here";
  errno = 0;
  EXPECT_FALSE(write_all(fd, "bytes"));
  EXPECT_EQ(errno, ENOSPC);
  ::close(fd);
}

TEST(WriteAll, AClosedReaderIsFalseWithEpipe) {
  struct sigaction ignore {
  }, saved{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGPIPE, &ignore, &saved), 0);
  Pipe p;
  ::close(p.fds[0]);
  p.fds[0] = -1;
  errno = 0;
  EXPECT_FALSE(write_all(p.fds[1], "bytes"));
  EXPECT_EQ(errno, EPIPE);
  ::sigaction(SIGPIPE, &saved, nullptr);
}

TEST(WriteAll, ABadDescriptorIsFalseWithEbadf) {
  errno = 0;
  EXPECT_FALSE(write_all(-1, "bytes"));
  EXPECT_EQ(errno, EBADF);
}

// Another node's command line is printed on every node's console: it used to set the
// window title, clear the screen and forge a launcher line.
TEST(PrintableText, ControlsAndBytesThatAreNotUtf8BecomeHexEscapes) {
  EXPECT_EQ(printable_text("./train --lr 0.1"), "./train --lr 0.1");
  EXPECT_EQ(printable_text("\x1b]0;pwned\a\x1b[2J\nxla-spawn: job FAKE"),
            "\\x1b]0;pwned\\x07\\x1b[2J\\x0axla-spawn: job FAKE");
  EXPECT_EQ(printable_text("caf\xc3\xa9 \xe2\x82\xac"), "caf\xc3\xa9 \xe2\x82\xac");  // UTF-8 stays
  EXPECT_EQ(printable_text("\xff\xfe \xc3"), "\\xff\\xfe \\xc3");  // not UTF-8, or cut short
  EXPECT_EQ(printable_text(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(printable_text("\x7f"), "\\x7f");
}

TEST(Utf8Prefix, NeverSplitsACharacter) {
  const std::string text = "ab\xc3\xa9\xe2\x82\xac";  // a b é €: 2 + 2 + 3 bytes
  EXPECT_EQ(utf8_prefix(text, 100), text);
  EXPECT_EQ(utf8_prefix(text, 4), "ab\xc3\xa9");
  EXPECT_EQ(utf8_prefix(text, 3), "ab");
  EXPECT_EQ(utf8_prefix(text, 6), "ab\xc3\xa9");
  EXPECT_EQ(utf8_prefix(text, 0), "");
}

}  // namespace
}  // namespace xs
