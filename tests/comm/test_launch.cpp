// The MPI-free parts of the bootstrap: GPU assignment (train.gpu) and launcher classification.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::comm {
namespace {

// The GPUs `n` local ranks see when every rank sees the node's `gpus` GPUs (mpirun, or srun
// without GPU binding), and when the launcher gives each rank its own (srun --gpus-per-task=1
// --gpu-bind=single:1, where CUDA_VISIBLE_DEVICES holds one, different, entry per rank).
std::vector<VisibleGpus> shared(int n, int gpus) {
  VisibleGpus all;
  for (int g = 0; g < gpus; ++g)
    all.push_back("GPU-" + std::to_string(g));
  return std::vector<VisibleGpus>(static_cast<std::size_t>(n), all);
}
std::vector<VisibleGpus> one_each(int n) {
  std::vector<VisibleGpus> views;
  for (int r = 0; r < n; ++r)
    views.push_back({"GPU-" + std::to_string(r)});
  return views;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ChooseGpus, RanksThatSeeEveryGpuTakeTheirLocalRank) {
  EXPECT_EQ(choose_gpus(GpuChoice{}, shared(4, 4)), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(choose_gpus(GpuChoice{}, shared(2, 8)), (std::vector<int>{0, 1}));  // the first ones
  EXPECT_EQ(choose_gpus(GpuChoice::parse("local_rank"), shared(4, 4)),
            (std::vector<int>{0, 1, 2, 3}));
}

TEST(ChooseGpus, RanksGivenOneGpuEachByTheLauncherTakeTheirOnlyDevice) {
  // Refused before train.gpu existed: 4 ranks but 1 visible GPU looked like ranks sharing one.
  EXPECT_EQ(choose_gpus(GpuChoice{}, one_each(4)), (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(choose_gpus(GpuChoice::parse("first_visible"), one_each(4)),
            (std::vector<int>{0, 0, 0, 0}));
}

TEST(ChooseGpus, RanksBoundToGroupsOfGpusTakeTheirPlaceInTheirGroup) {
  // srun --gpus-per-task=2 with 2 tasks, or two jobs' worth of ranks each seeing their own pair.
  std::vector<VisibleGpus> views{{"GPU-0", "GPU-1"}, {"GPU-2", "GPU-3"}, {"GPU-0", "GPU-1"}};
  EXPECT_EQ(choose_gpus(GpuChoice{}, views), (std::vector<int>{0, 0, 1}));
}

TEST(ChooseGpus, MoreLocalRanksThanSharedGpusIsAnErrorNamingBothCounts) {
  const std::string message = message_of([] { choose_gpus(GpuChoice{}, shared(8, 4)); });
  EXPECT_NE(message.find("8 ranks on this node but only 4 GPUs visible"), std::string::npos)
      << message;
  EXPECT_NE(message.find("at most 4 ranks per node"), std::string::npos) << message;
}

TEST(ChooseGpus, ForcedChoicesThatDoNotFitAreErrorsNamingTheKeyAndTheRank) {
  std::string message =
      message_of([] { choose_gpus(GpuChoice::parse("local_rank"), one_each(2)); });
  EXPECT_NE(message.find("train.gpu = local_rank: local rank 1 sees only 1 GPU"), std::string::npos)
      << message;
  message = message_of([] { choose_gpus(GpuChoice::parse("3"), shared(1, 2)); });
  EXPECT_NE(message.find("train.gpu = 3: local rank 0 sees only 2 GPU"), std::string::npos)
      << message;
}

TEST(ChooseGpus, TwoRanksOnOnePhysicalGpuIsAnErrorNamingBoth) {
  const std::string message =
      message_of([] { choose_gpus(GpuChoice::parse("first_visible"), shared(2, 2)); });
  EXPECT_NE(message.find("local ranks 0 and 1 would both drive GPU-0"), std::string::npos)
      << message;
  // Overlapping views that auto cannot separate are refused the same way.
  std::vector<VisibleGpus> views{{"GPU-0", "GPU-1"}, {"GPU-0", "GPU-2"}};
  EXPECT_NE(message_of([&] { choose_gpus(GpuChoice{}, views); }).find("would both drive GPU-0"),
            std::string::npos);
}

TEST(ChooseGpus, ARankThatSeesNoGpuIsAnError) {
  std::vector<VisibleGpus> views{{"GPU-0"}, {}};
  EXPECT_NE(message_of([&] { choose_gpus(GpuChoice{}, views); }).find("local rank 1 sees no GPU"),
            std::string::npos);
}

TEST(GpuChoice, ParsesTheDocumentedValuesAndNamesTheKeyOtherwise) {
  EXPECT_EQ(GpuChoice::parse("auto").kind, GpuChoice::Kind::Auto);
  EXPECT_EQ(GpuChoice::parse("local_rank").kind, GpuChoice::Kind::LocalRank);
  EXPECT_EQ(GpuChoice::parse("first_visible").kind, GpuChoice::Kind::FirstVisible);
  EXPECT_EQ(GpuChoice::parse("2").kind, GpuChoice::Kind::Index);
  EXPECT_EQ(GpuChoice::parse("2").index, 2);
  EXPECT_EQ(GpuChoice::parse("first_visible").str(), "first_visible");
  for (const char* bad : {"", "gpu0", "-1", "1.5", "cuda:1", "99999"}) {
    const std::string message = message_of([&] { GpuChoice::parse(bad); });
    EXPECT_NE(message.find("train.gpu"), std::string::npos) << "'" << bad << "': " << message;
  }
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
