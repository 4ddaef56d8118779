#include "xla_spawn/collectives/local_communicator.h"

#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"

namespace xs {
namespace {

TEST(LocalCommunicatorTest, EveryCollectiveIsTheIdentity) {
  LocalCommunicator comm;
  EXPECT_EQ(comm.ordinal(), 0);
  EXPECT_EQ(comm.world_size(), 1);
  std::vector<float> data = {1.5f, -2.0f};
  comm.all_reduce(data.data(), 2, DType::kF32, ReduceOp::kMean);
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f}));
  comm.broadcast(data.data(), 2, DType::kF32, 0);
  std::vector<float> out(2);
  comm.all_gather(data.data(), out.data(), 2, DType::kF32);
  EXPECT_EQ(out, data);
  out.assign(2, 0.0f);
  comm.reduce_scatter(data.data(), out.data(), 2, DType::kF32, ReduceOp::kSum);
  EXPECT_EQ(out, data);
  comm.barrier();
  const std::byte payload[] = {std::byte{7}};
  const auto all = comm.rendezvous("tag", payload);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], std::vector<std::byte>{std::byte{7}});
}

TEST(LocalCommunicatorTest, RejectsWhatAJobWouldReject) {
  LocalCommunicator comm;
  bool flags[2] = {};
  EXPECT_THROW(comm.all_reduce(flags, 2, DType::kBool, ReduceOp::kSum), InvalidArgument);
  EXPECT_THROW(comm.broadcast(flags, 2, DType::kBool, 1), InvalidArgument);
}

}  // namespace
}  // namespace xs
