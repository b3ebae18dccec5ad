// The MPI-free parts of the bootstrap: GPU assignment and launcher classification.
#include <gtest/gtest.h>

#include <string>

#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::comm {
namespace {

TEST(GpuForLocalRank, EachLocalRankTakesItsOwnGpuWhenAllRanksSeeAllGpus) {
  for (int local = 0; local < 4; ++local)
    EXPECT_EQ(gpu_for_local_rank(local, 4, 4), local);
  EXPECT_EQ(gpu_for_local_rank(1, 2, 8), 1);  // fewer ranks than GPUs: the first ones are used
}

TEST(GpuForLocalRank, MoreLocalRanksThanGpusIsAnErrorNamingBothCounts) {
  try {
    gpu_for_local_rank(0, 8, 4);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("8 ranks on this node"), std::string::npos) << message;
    EXPECT_NE(message.find("only 4 GPUs visible"), std::string::npos) << message;
    EXPECT_NE(message.find("at most 4 ranks per node"), std::string::npos) << message;
  }
}

TEST(GpuForLocalRank, NoVisibleGpuIsAnError) {
  EXPECT_THROW(gpu_for_local_rank(0, 1, 0), Error);
  EXPECT_THROW(gpu_for_local_rank(0, 1, 0, /*shared_visibility=*/false), Error);
}

TEST(GpuForLocalRank, RanksBoundToTheirOwnGpuByTheLauncherUseTheirFirstDevice) {
  // srun --gpus-per-task=1: four ranks, each seeing exactly one (different) GPU.
  for (int local = 0; local < 4; ++local) {
    EXPECT_EQ(gpu_for_local_rank(local, 4, 1, /*shared_visibility=*/false), 0);
  }
}

TEST(GpuForLocalRank, LocalRankOutsideTheNodeIsAnError) {
  EXPECT_THROW(gpu_for_local_rank(4, 4, 4), Error);
  EXPECT_THROW(gpu_for_local_rank(-1, 4, 4), Error);
}

TEST(LaunchInfo, MpirunIsRecognisedFromOmpiVariables) {
  LaunchInfo info = LaunchInfo::from_variables(
      {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"HOME", "/root"}});
  EXPECT_EQ(info.launcher, "mpirun");
  EXPECT_EQ(info.get_int("OMPI_COMM_WORLD_RANK"), 3);
  EXPECT_FALSE(info.get("HOME").has_value()) << "only launcher variables are recorded";
}

TEST(LaunchInfo, MpirunInsideSbatchIsNotMistakenForSrun) {
  // Inside an sbatch script every mpirun rank inherits the batch step's SLURM_PROCID=0.
  LaunchInfo info = LaunchInfo::from_variables({{"OMPI_COMM_WORLD_RANK", "1"},
                                                {"SLURM_JOB_ID", "42"},
                                                {"SLURM_PROCID", "0"},
                                                {"SLURM_STEP_ID", "4294967294"}});
  EXPECT_EQ(info.launcher, "mpirun inside Slurm job 42");
  EXPECT_NE(info.describe().find("SLURM_PROCID=0"), std::string::npos) << info.describe();
}

TEST(LaunchInfo, SrunIsRecognisedFromAStepWithoutOmpiVariables) {
  LaunchInfo info = LaunchInfo::from_variables(
      {{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"}, {"PMIX_RANK", "1"}});
  EXPECT_EQ(info.launcher, "srun");
  EXPECT_EQ(info.get_int("SLURM_PROCID"), 1);
}

TEST(LaunchInfo, NoLauncherVariablesMeansSingleton) {
  LaunchInfo info = LaunchInfo::from_variables({{"PATH", "/usr/bin"}});
  EXPECT_EQ(info.launcher, "singleton");
  EXPECT_TRUE(info.env.empty());
  EXPECT_EQ(info.describe(), "launcher=singleton");
}

TEST(LaunchInfo, NonNumericValuesAreNotIntegers) {
  LaunchInfo info = LaunchInfo::from_variables({{"SLURM_PROCID", "1x"}, {"SLURM_NTASKS", ""}});
  EXPECT_FALSE(info.get_int("SLURM_PROCID").has_value());
  EXPECT_FALSE(info.get_int("SLURM_NTASKS").has_value());
  EXPECT_FALSE(info.get_int("SLURM_LOCALID").has_value());
}

}  // namespace
}  // namespace lockstep::comm
