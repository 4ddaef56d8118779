// Security: a running job's segment is owner-only, so another user on the machine cannot open
// or attach to it (checked for real: a forked child drops to uid/gid 65534 "nobody" and tries),
// checkpoints are written with mode 0600 whatever the umask, and what another user leaves at
// the names a run writes or reads (a symlink at the CSV's, a checkpoint to resume, a log file)
// is not used.

#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "xla_spawn/shm/segment.h"
#include "tests/launcher/launch_support.h"
#include "tests/reliability/job_probe.h"
#include "tests/support/scoped_env.h"

namespace xs::testing {
namespace {

using std::chrono::seconds;

constexpr uid_t kNobody = 65534;

// Child exit codes of try_as_nobody, so a failure says which step let the other user in.
enum NobodyResult {
  kAllDenied = 0,
  kDropFailed = 10,
  kShmOpenAllowed,
  kFileOpenAllowed,
  kAttached,
  kWrongErrno
};

// Forks, becomes nobody (groups, gid, uid; no way back), and tries to open the segment with
// shm_open, through /dev/shm and with Segment::attach. Returns the child's NobodyResult.
int try_as_nobody(const std::string& name, const std::string& job_id) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(kNobody, kNobody, kNobody) != 0 ||
        ::setresuid(kNobody, kNobody, kNobody) != 0 || ::geteuid() != kNobody) {
      ::_exit(kDropFailed);
    }
    for (int flags : {O_RDWR, O_RDONLY}) {
      const int fd = ::shm_open(name.c_str(), flags, 0);
      if (fd >= 0) ::_exit(kShmOpenAllowed);
      if (errno != EACCES) ::_exit(kWrongErrno);
      if (::open(("/dev/shm" + name).c_str(), flags) >= 0) ::_exit(kFileOpenAllowed);
    }
    try {
      Segment::attach(name, 0, 1, job_id);
      ::_exit(kAttached);
    } catch (...) {
    }
    ::_exit(kAllDenied);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(SecurityTest, AnotherUserCannotOpenOrAttachToARunningJobsSegment) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root to fork a child that switches to another uid (nobody, 65534); "
                    "run the suite as root to check this";
  }
  TempDir dir;
  Launch run({"-n", "1", "--", "/bin/sh", "-c",
              R"(echo "SEG $XLA_SPAWN_SEGMENT $XLA_SPAWN_JOB_ID"; sleep 60)"});
  std::string name, job_id;
  ASSERT_TRUE(wait_until(
      [&] {
        const auto lines = lines_with(run.out(), "[0] SEG ");
        if (lines.empty()) return false;
        const std::string rest = lines.front().substr(8);
        name = rest.substr(0, rest.find(' '));
        job_id = rest.substr(rest.find(' ') + 1);
        return true;
      },
      seconds(30)))
      << run.err();
  struct stat st {};
  ASSERT_EQ(::stat(("/dev/shm" + name).c_str(), &st), 0) << name;
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "segment mode " << std::oct << (st.st_mode & 07777);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(try_as_nobody(name, job_id), kAllDenied)
      << "codes: 10 could not drop privileges, 11 shm_open allowed, 12 open allowed, "
         "13 attached, 14 error other than EACCES";
  ::kill(run.pid(), SIGTERM);
  run.wait_or_fail(seconds(30));
}

TEST(SecurityTest, CheckpointsAreOwnerOnlyWhateverTheUmask) {
  TempDir dir;
  const mode_t old_umask = ::umask(0);  // the most permissive: 0600 must come from the writer
  std::vector<std::string> args = {"-n", "2"};
  const std::vector<std::string> train = train_command(dir / "model.ckpt", 3);
  args.insert(args.end(), train.begin(), train.end());
  const RunResult r = run_xla_spawn(args, seconds(120));
  ::umask(old_umask);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  struct stat st {};
  ASSERT_EQ(::stat((dir / "model.ckpt").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "checkpoint mode " << std::oct << (st.st_mode & 07777);
}

// What another user may leave in a shared directory (/tmp) at the names a root run writes or
// reads: the files below are made as root and given to nobody (chown), as if nobody made them.
class PlantedByAnotherUser : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to give files to another user (chown)";
    ASSERT_EQ(::chmod(dir_.path().c_str(), 01777), 0);  // a shared directory, like /tmp
  }
  static void give_to_nobody(const std::string& path) {
    ASSERT_EQ(::lchown(path.c_str(), kNobody, kNobody), 0) << path;
  }
  std::vector<std::string> train(const std::vector<std::string>& extra) const {
    std::vector<std::string> args = {"-n", "1", "--", train_fmnist_path(), "--model", "mlp",
                                     "--batch-size", "16", "--epochs", "1", "--max-steps", "3",
                                     "--train-samples", "256", "--no-eval"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  TempDir dir_;
};

// The step-timing CSV went through a symlink planted at its name and overwrote its target.
TEST_F(PlantedByAnotherUser, ASymlinkAtTheCsvsNameIsReplacedNotWrittenThrough) {
  const std::string victim = dir_ / "victim", csv = dir_ / "t.csv";
  { std::ofstream(victim) << "root's own file\n"; }
  ASSERT_EQ(::symlink(victim.c_str(), csv.c_str()), 0);
  give_to_nobody(csv);
  const RunResult r = run_xla_spawn(train({"--step-timing-csv", csv}), seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(victim), "root's own file\n");
  struct stat st {};
  ASSERT_EQ(::lstat(csv.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode)) << "the CSV is a file of its own now";
  EXPECT_EQ(st.st_mode & 07777, 0600u) << std::oct << (st.st_mode & 07777);
  EXPECT_EQ(st.st_uid, 0u);
}

// --resume took whatever checkpoint lay at its path, whoever wrote it.
TEST_F(PlantedByAnotherUser, ACheckpointOfAnotherUserIsNotResumed) {
  const std::string ckpt = dir_ / "m.ckpt";
  ASSERT_EQ(run_xla_spawn(train({"--checkpoint", ckpt}), seconds(120)).exit_code, 0);
  give_to_nobody(ckpt);
  RunResult r = run_xla_spawn(train({"--checkpoint", ckpt, "--resume"}), seconds(120));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("belongs to uid 65534, not this user"), std::string::npos) << r.err;
  // Nor one that anyone may rewrite, even the user's own.
  ASSERT_EQ(::lchown(ckpt.c_str(), 0, 0), 0);
  ASSERT_EQ(::chmod(ckpt.c_str(), 0666), 0);
  r = run_xla_spawn(train({"--checkpoint", ckpt, "--resume"}), seconds(120));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("group or others may write it (mode 0666)"), std::string::npos) << r.err;
  ASSERT_EQ(::chmod(ckpt.c_str(), 0600), 0);
  // Nor root's own checkpoint behind another user's symlink at the path: they chose it.
  const std::string link = dir_ / "job.ckpt";
  ASSERT_EQ(::symlink(ckpt.c_str(), link.c_str()), 0);
  give_to_nobody(link);
  r = run_xla_spawn(train({"--checkpoint", link, "--resume"}), seconds(120));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("reached through " + link + " (a symlink of uid 65534)"), std::string::npos) << r.err;
  r = run_xla_spawn(train({"--checkpoint", ckpt, "--resume"}), seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A directory reached through another user's symlink is theirs to choose: root's checkpoint,
// or its graph dumps, would land wherever they point it (/etc, say).
TEST_F(PlantedByAnotherUser, NothingIsWrittenThroughAnotherUsersSymlinkedDirectory) {
  const std::string real = dir_ / "real", link = dir_ / "link";
  ASSERT_EQ(::mkdir(real.c_str(), 0755), 0);
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  give_to_nobody(link);
  RunResult r = run_xla_spawn(train({"--checkpoint", link + "/m.ckpt"}), seconds(120));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("is reached through " + link + " (a symlink of uid 65534)"), std::string::npos) << r.err;
  {
    ScopedEnv dumps("XLA_SPAWN_DUMP_GRAPHS", link + "/graphs");
    r = run_xla_spawn(train({}), seconds(120));
  }
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("XLA_SPAWN_DUMP_GRAPHS=" + link + "/graphs: the directory is reached through " + link),
            std::string::npos)
      << r.err;
  // Nor the launcher's log files and trace.
  r = run_xla_spawn({"-n", "1", "--log-dir", link + "/logs", "--", "/bin/true"}, seconds(30));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--log-dir " + link + "/logs: reached through " + link), std::string::npos) << r.err;
  r = run_xla_spawn({"-n", "1", "--trace", link + "/t.json", "--", "/bin/true"}, seconds(30));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("is reached through " + link + " (a symlink of uid 65534)"), std::string::npos) << r.err;
  EXPECT_TRUE(std::filesystem::is_empty(real));
}

// A FIFO another user made at the CSV's name: they would read what is written.
TEST_F(PlantedByAnotherUser, AnotherUsersFifoAtTheCsvsNameIsRefused) {
  const std::string fifo = dir_ / "t.csv";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  give_to_nobody(fifo);
  const RunResult r = run_xla_spawn(train({"--step-timing-csv", fifo}), seconds(120));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("a FIFO of uid 65534"), std::string::npos) << r.err;
}

// A log file another user made (and can chmod back) would let them read the replicas' output.
TEST_F(PlantedByAnotherUser, ALogFileOfAnotherUserIsRefused) {
  const std::string logs = dir_ / "logs";
  ASSERT_EQ(::mkdir(logs.c_str(), 0777), 0);
  { std::ofstream(logs + "/ordinal-0.log") << ""; }
  give_to_nobody(logs + "/ordinal-0.log");
  RunResult r =
      run_xla_spawn({"-n", "1", "--log-dir", logs, "--", "/bin/sh", "-c", "echo SECRET"}, seconds(30));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("belongs to uid 65534, not this user"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(logs + "/ordinal-0.log"), "");
  // A hard link to one of the user's own files (planted where protected_hardlinks is off):
  // the log would be appended to that file.
  const std::string victim = dir_ / "victim";
  { std::ofstream(victim) << "root's own file\n"; }
  ASSERT_EQ(::unlink((logs + "/ordinal-0.log").c_str()), 0);
  ASSERT_EQ(::link(victim.c_str(), (logs + "/ordinal-0.log").c_str()), 0);
  r = run_xla_spawn({"-n", "1", "--log-dir", logs, "--", "/bin/sh", "-c", "echo SECRET"}, seconds(30));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("has 2 names (a hard link)"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(victim), "root's own file\n");
}

}  // namespace
}  // namespace xs::testing
