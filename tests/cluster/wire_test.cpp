// The rendezvous wire format and the job token: every message survives a round trip, and
// malformed frames (truncated, oversized, unknown, trailing bytes) are ProtocolErrors.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "xla_spawn/cluster/job_token.h"
#include "xla_spawn/cluster/siphash.h"
#include "xla_spawn/cluster/wire.h"
#include "tests/support/scoped_env.h"

namespace xs::cluster {
namespace {

std::string body_of(const Message& m) {
  return encode_frame(m).substr(4);
}

Message round_trip(const Message& m) {
  const std::string frame = encode_frame(m);
  uint32_t length = 0;
  for (int i = 3; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(frame[static_cast<size_t>(i)]);
  EXPECT_EQ(length, frame.size() - 4);
  return decode(std::string_view(frame).substr(4));
}

TEST(SipHash, MatchesThePapersTestVector) {
  // Appendix A of the SipHash paper: key 00..0f, message 00..0e.
  const SipKey key{0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL};
  unsigned char message[15];
  for (int i = 0; i < 15; ++i) message[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(siphash24(key, message, sizeof message), 0xa129ca6149be45e5ULL);
}

TEST(Wire, EveryMessageSurvivesARoundTrip) {
  Failed failed;
  failed.attempt = 2;
  failed.local_ordinal = 1;
  failed.kind = FailureKind::kSignalled;
  failed.exit_code = 137;
  failed.wall_ns = -5;
  failed.description = "killed by signal 9";
  failed.tail = {"line one", "", "line three"};
  const Message m = round_trip(failed);
  const Failed& back = std::get<Failed>(m);
  EXPECT_EQ(back.attempt, 2u);
  EXPECT_EQ(back.local_ordinal, 1);
  EXPECT_EQ(back.kind, FailureKind::kSignalled);
  EXPECT_EQ(back.exit_code, 137);
  EXPECT_EQ(back.wall_ns, -5);
  EXPECT_EQ(back.tail, failed.tail);

  World world{"xs-1-2", 4242, 3, {{2, "a", "198.18.0.1"}, {1, "b", "198.18.0.2"}}, "a note"};
  const World w = std::get<World>(round_trip(world));
  EXPECT_EQ(w.max_restarts, 3u);
  EXPECT_EQ(w.notice, "a note");
  ASSERT_EQ(w.nodes.size(), 2u);
  EXPECT_EQ(w.nodes[1].hostname, "b");
  EXPECT_EQ(w.torch_port, 4242u);

  const std::vector<char> value(100000, 'x');
  EXPECT_EQ(std::get<StoreSet>(round_trip(StoreSet{"key", value})).value, value);
  EXPECT_EQ(std::get<StoreWait>(round_trip(StoreWait{{"a", "bb", ""}, 7})).keys.size(), 3u);
  Hello hello;
  hello.role = Role::kStore;
  hello.nonce[3] = 9;
  EXPECT_EQ(std::get<Hello>(round_trip(hello)).nonce, hello.nonce);
  EXPECT_EQ(std::get<Next>(round_trip(Next{3, "the cause"})).cause, "the cause");
  const Register reg = std::get<Register>(round_trip(Register{1, 2, 4, 77, "b", "198.18.0.2", 300,
                                                              "./train 'a b'"}));
  EXPECT_EQ(reg.heartbeat_timeout_ms, 300u);
  EXPECT_EQ(reg.command, "./train 'a b'");
  const Alive alive = std::get<Alive>(round_trip(Alive{3, -9, "why"}));
  EXPECT_EQ(alive.node, 3u);
  EXPECT_EQ(alive.pid, -9);
  EXPECT_EQ(alive.leaving, "why");
  for (const Message& each : {Message(Heartbeat{}), Message(StoreOk{}), Message(Next{3, ""}),
                              Message(End{137, "summary"}), Message(Stop{1, "why"}),
                              Message(AttemptDone{1, 3}), Message(ErrorReply{"no"})}) {
    EXPECT_EQ(round_trip(each).index(), each.index()) << message_name(each);
  }
}

TEST(Wire, EveryTruncationOfAFrameIsAProtocolError) {
  const std::string body =
      body_of(Register{1, 2, 4, 77, "host-b", "198.18.0.2", 5000, "./train 'a b'"});
  for (size_t n = 0; n < body.size(); ++n) {
    EXPECT_THROW(decode(std::string_view(body).substr(0, n)), ProtocolError) << "length " << n;
  }
}

TEST(Wire, TrailingBytesUnknownTypesAndBadEnumsAreRefused) {
  EXPECT_THROW(decode(body_of(Heartbeat{}) + "x"), ProtocolError);
  EXPECT_THROW(decode(std::string(1, '\0')), ProtocolError);
  EXPECT_THROW(decode(std::string(1, '\x7f')), ProtocolError);
  std::string hello = body_of(Hello{});
  hello[9] = 9;  // role: type byte, magic (4), version (4), then the role
  EXPECT_THROW(decode(hello), ProtocolError);
}

TEST(Wire, ALengthAboveItsLimitIsRefusedBeforeAnythingIsAllocated) {
  // ErrorReply claiming 4 GiB of text in a 10-byte frame.
  std::string body(1, static_cast<char>(5));  // ErrorReply's type
  body += std::string("\xff\xff\xff\xff", 4);
  try {
    decode(body);
    FAIL() << "accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("above the limit"), std::string::npos) << e.what();
  }
  // A list count that the frame cannot hold.
  std::string world(1, static_cast<char>(7));  // World
  world += std::string(4, '\0') + std::string(8, '\0') + std::string("\x00\x10\x00\x00", 4);
  EXPECT_THROW(decode(world), ProtocolError);
}

TEST(JobToken, RefusesShortAndNonPrintableTokens) {
  EXPECT_THROW(JobToken("short", "test"), InvalidArgument);
  EXPECT_THROW(JobToken("0123456789abcdef 0123", "test"), InvalidArgument);
  EXPECT_NO_THROW(JobToken("0123456789abcdef", "test"));
}

TEST(JobToken, DifferentTokensGiveDifferentMacsAndPurposesAreSeparated) {
  const JobToken a("0123456789abcdef0123", "a");
  const JobToken b("0123456789abcdef0124", "b");
  const Nonce n1 = random_nonce();
  const Nonce n2 = random_nonce();
  EXPECT_TRUE(mac_equal(a.mac("x", n1, n2), a.mac("x", n1, n2)));
  EXPECT_FALSE(mac_equal(a.mac("x", n1, n2), b.mac("x", n1, n2)));
  EXPECT_FALSE(mac_equal(a.mac("x", n1, n2), a.mac("y", n1, n2)));
  EXPECT_FALSE(mac_equal(a.mac("x", n1, n2), a.mac("x", n2, n1)));
}

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("xs-token-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(TokenFileTest, IsCreatedPrivateOnFirstUseAndFoundAgain) {
  testing::ScopedEnv no_token(kJobTokenEnv, std::nullopt);
  testing::ScopedEnv no_file(kJobTokenFileEnv, std::nullopt);
  testing::ScopedEnv config("XDG_CONFIG_HOME", dir_.string());
  const JobToken first = JobToken::load();
  const JobToken second = JobToken::load();
  EXPECT_EQ(first.text(), second.text());
  EXPECT_EQ(first.text().size(), 32u);
  struct stat st {};
  ASSERT_EQ(::stat(first.source().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(TokenFileTest, AFileOthersCanReadIsRefused) {
  std::filesystem::create_directories(dir_);
  const std::string path = (dir_ / "token").string();
  std::ofstream(path) << "0123456789abcdef0123\n";
  ::chmod(path.c_str(), 0644);
  testing::ScopedEnv no_token(kJobTokenEnv, std::nullopt);
  testing::ScopedEnv file(kJobTokenFileEnv, path);
  try {
    JobToken::load();
    FAIL() << "accepted a world-readable token file";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("chmod 600"), std::string::npos) << e.what();
  }
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(JobToken::load().text(), "0123456789abcdef0123");
}

// A file named by the variable must exist (only the default one is made): its absence is a
// bad setting, named with the variable, not a failure of the system.
TEST_F(TokenFileTest, AMissingNamedFileIsABadSettingNamingTheVariable) {
  testing::ScopedEnv no_token(kJobTokenEnv, std::nullopt);
  const std::string path = (dir_ / "no-such-token").string();
  testing::ScopedEnv file(kJobTokenFileEnv, path);
  try {
    JobToken::load();
    FAIL() << "a missing token file was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(std::string(kJobTokenFileEnv) + ": job token file " + path),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "the named file was created";
}

}  // namespace
}  // namespace xs::cluster
