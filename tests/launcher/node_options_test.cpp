// How xla-spawn learns its node of a multi-node job: flags, Slurm's and Open MPI's
// environment, and the errors for combinations that cannot form a job.

#include "xla_spawn/launcher/node_options.h"

#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "xla_spawn/launcher/options.h"
#include "tests/support/scoped_env.h"

namespace xs {
namespace {

// No scheduler in the environment unless a test sets one.
class NodeOptionsTest : public ::testing::Test {
 protected:
  testing::ScopedEnv slurm_nodes_{"SLURM_NNODES", std::nullopt};
  testing::ScopedEnv slurm_procid_{"SLURM_PROCID", std::nullopt};
  testing::ScopedEnv slurm_tasks_{"SLURM_NTASKS", std::nullopt};
  testing::ScopedEnv slurm_node_{"SLURM_NODEID", std::nullopt};
  testing::ScopedEnv slurm_list_{"SLURM_JOB_NODELIST", std::nullopt};
  testing::ScopedEnv mpi_size_{"OMPI_COMM_WORLD_SIZE", std::nullopt};
  testing::ScopedEnv mpi_rank_{"OMPI_COMM_WORLD_RANK", std::nullopt};
  testing::ScopedEnv mpi_local_{"OMPI_COMM_WORLD_LOCAL_SIZE", std::nullopt};
};

// What srun sets in a task: node `node` of `nnodes`, `tasks` tasks in all.
struct SrunEnv {
  SrunEnv(const std::string& nnodes, const std::string& node, const std::string& tasks,
          const std::string& nodelist)
      : nodes("SLURM_NNODES", nnodes),
        procid("SLURM_PROCID", node),
        tasks("SLURM_NTASKS", tasks),
        node("SLURM_NODEID", node),
        list("SLURM_JOB_NODELIST", nodelist) {}
  testing::ScopedEnv nodes, procid, tasks, node, list;
};

std::string usage_error(const NodeFlags& flags) {
  try {
    resolve_node_options(flags);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "accepted";
}

TEST_F(NodeOptionsTest, FlagsGiveTheNode) {
  const NodeOptions o = resolve_node_options(
      {"2", "1", "198.18.0.1", "29600", "30"});
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node, 1);
  EXPECT_EQ(o.master_addr, "198.18.0.1");
  EXPECT_EQ(o.master_port, 29600);
  EXPECT_EQ(o.rdzv_timeout, std::chrono::seconds(30));
  EXPECT_TRUE(o.multi_node());
}

TEST_F(NodeOptionsTest, WithoutFlagsOrSchedulerItIsOneNode) {
  const NodeOptions o = resolve_node_options({});
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_FALSE(o.multi_node());
  EXPECT_EQ(o.master_port, kDefaultMasterPort);
}

TEST_F(NodeOptionsTest, BadCombinationsSayWhatIsMissing) {
  EXPECT_NE(usage_error({"2", "2", "a", {}, {}}).find("node rank 2"), std::string::npos);
  EXPECT_NE(usage_error({"2", "0", {}, {}, {}}).find("needs --master-addr"), std::string::npos);
  EXPECT_NE(usage_error({{}, "1", "a", {}, {}}).find("need --nnodes"), std::string::npos);
  EXPECT_NE(usage_error({{}, {}, {}, {}, "30"}).find("need --nnodes"), std::string::npos);
  EXPECT_NE(usage_error({"0", {}, {}, {}, {}}).find("--nnodes"), std::string::npos);
  EXPECT_NE(usage_error({"2", "0", "a", "70000", {}}).find("--master-port"), std::string::npos);
  EXPECT_NE(usage_error({"2", "0", "a", {}, "0"}).find("--rdzv-timeout"), std::string::npos);
  // No default node rank: every host that forgot it would claim node 0.
  EXPECT_NE(usage_error({"3", {}, "a", {}, {}}).find("--nnodes 3 needs --node-rank K on every host"),
            std::string::npos);
  EXPECT_EQ(resolve_node_options({"1", {}, {}, {}, {}}).nnodes, 1);
}

// Node 0 would listen on every address and advertise loopback; the other nodes' replicas
// then failed in gloo after the job had formed.
TEST_F(NodeOptionsTest, TheWildcardAddressIsNoMasterAddress) {
  for (const char* wildcard : {"0.0.0.0", "0", "::", "[::]", "0:0::0", "::ffff:0.0.0.0"}) {
    EXPECT_NE(usage_error({"2", "0", wildcard, {}, {}})
                  .find(fmt::format("--master-addr {} is the wildcard address", wildcard)),
              std::string::npos)
        << wildcard;
  }
  for (const char* address : {"127.0.0.1", "::1", "198.18.0.1", "node0", "0.0.0.1"}) {
    EXPECT_EQ(resolve_node_options({"2", "0", address, {}, {}}).master_addr, address);
  }
}

TEST_F(NodeOptionsTest, SlurmAndOpenMpiThatDisagreeAreRefusedNamingBoth) {
  const SrunEnv srun("3", "1", "3", "a,b,c");
  testing::ScopedEnv size("OMPI_COMM_WORLD_SIZE", "3");
  testing::ScopedEnv rank("OMPI_COMM_WORLD_RANK", "1");
  EXPECT_EQ(resolve_node_options({}).node, 1);  // agreeing: fine
  testing::ScopedEnv other_rank("OMPI_COMM_WORLD_RANK", "0");
  EXPECT_NE(usage_error({}).find("Slurm says node 1 of 3 (SLURM_NODEID, SLURM_NNODES), Open MPI "
                                 "says 0 of 3"),
            std::string::npos);
}

// Half of Open MPI's pair inside srun is refused as it is without Slurm (it was taken for
// no Open MPI at all).
TEST_F(NodeOptionsTest, HalfOfOpenMpisPairUnderSlurmIsRefused) {
  const SrunEnv srun("1", "0", "1", "a");
  testing::ScopedEnv size("OMPI_COMM_WORLD_SIZE", "3");
  EXPECT_EQ(usage_error({}), "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not");
}

// A rank past the scheduler's node count names the scheduler's count, not a --nnodes nobody
// gave.
TEST_F(NodeOptionsTest, ARankPastTheSchedulersNodeCountNamesTheScheduler) {
  testing::ScopedEnv size("OMPI_COMM_WORLD_SIZE", "1");
  testing::ScopedEnv rank("OMPI_COMM_WORLD_RANK", "3");
  EXPECT_EQ(usage_error({}), "node rank 3 must be less than the node count, 1 (both from Open MPI)");
}

TEST_F(NodeOptionsTest, SlurmGivesNodesRankAndTheFirstHostAsMaster) {
  const SrunEnv srun("3", "2", "3", "gpu[07-09]");
  const NodeOptions o = resolve_node_options({});
  EXPECT_EQ(o.source, "Slurm");
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.node, 2);
  EXPECT_EQ(o.master_addr, "gpu07");
  EXPECT_EQ(o.master_addr_from, "SLURM_JOB_NODELIST's first host");
  // Flags win over the environment.
  EXPECT_EQ(resolve_node_options({{}, {}, "10.0.0.1", {}, {}}).master_addr, "10.0.0.1");
  EXPECT_EQ(resolve_node_options({{}, {}, "10.0.0.1", {}, {}}).master_addr_from, "--master-addr");
  // But not over the task's own rank: two hosts would be the same node (it used to win
  // silently, and the node said it came "from Slurm").
  EXPECT_EQ(resolve_node_options({{}, "2", {}, {}, {}}).node, 2);
  EXPECT_EQ(usage_error({{}, "0", {}, {}, {}}),
            "--node-rank 0 but Slurm says this is node 2: leave out --node-rank under srun or "
            "mpirun, or give --nnodes too");
}

TEST_F(NodeOptionsTest, SlurmWithSeveralTasksPerNodeIsRefused) {
  const SrunEnv srun("2", "0", "8", "a,b");
  EXPECT_NE(usage_error({}).find("--ntasks-per-node=1"), std::string::npos);
}

TEST_F(NodeOptionsTest, ABatchScriptOutsideSrunIsOneNode) {
  testing::ScopedEnv nodes("SLURM_NNODES", "4");  // set for the whole allocation...
  testing::ScopedEnv node("SLURM_NODEID", "0");   // ...but no SLURM_PROCID: not inside srun
  EXPECT_EQ(resolve_node_options({}).nnodes, 1);
}

TEST_F(NodeOptionsTest, OpenMpiGivesNodesAndRankButNotTheMaster) {
  testing::ScopedEnv size("OMPI_COMM_WORLD_SIZE", "2");
  testing::ScopedEnv rank("OMPI_COMM_WORLD_RANK", "1");
  testing::ScopedEnv local("OMPI_COMM_WORLD_LOCAL_SIZE", "1");
  EXPECT_NE(usage_error({}).find("needs --master-addr"), std::string::npos);
  const NodeOptions o = resolve_node_options({{}, {}, "198.18.0.1", {}, {}});
  EXPECT_EQ(o.source, "Open MPI");
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node, 1);
}

TEST(FirstSlurmHost, ExpandsTheFirstRangeKeepingItsPadding) {
  EXPECT_EQ(first_slurm_host("node[03-05,9],gpu1"), "node03");
  EXPECT_EQ(first_slurm_host("rack[1-2]-n[7-8]"), "rack1-n7");
  EXPECT_EQ(first_slurm_host("solo"), "solo");
  EXPECT_EQ(first_slurm_host("a,b[1-2]"), "a");
  EXPECT_THROW(first_slurm_host(""), InvalidArgument);
  EXPECT_THROW(first_slurm_host("node[1-2"), InvalidArgument);
  EXPECT_THROW(first_slurm_host("node[x-2]"), InvalidArgument);
  // Nested or stray brackets used to give "node1]" and "node1x".
  EXPECT_THROW(first_slurm_host("node[1-[2-3]]"), InvalidArgument);
  EXPECT_THROW(first_slurm_host("node[1x-3]"), InvalidArgument);
  EXPECT_THROW(first_slurm_host("node1]"), InvalidArgument);
}

TEST(ShownOrdinals, AreCutToThisNodesReplicas) {
  EXPECT_EQ(resolve_shown_ordinals("0,3-4", 2, 3, 6), (std::vector<bool>{false, true, true}));
  EXPECT_THROW(resolve_shown_ordinals("9", 0, 2, 6), UsageError);
}

}  // namespace
}  // namespace xs
