// A bad label in a training step on a device is reported as a bad label, naming it, by the step's
// first host wait (the gradient check), not as a non-finite gradient with a hint to lower the
// learning rate: on every device kind (the emulated GPU everywhere, CUDA where a GPU answers).
//
// Needs the parallel layer, which the GPU-check build (LOCKSTEP_GPU_CHECK_ONLY) does not have:
// there the file compiles to nothing.
#include "support/device_test_support.hpp"

#if __has_include("lockstep/parallel/ddp.hpp")
#include "lockstep/comm/local.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/parallel/ddp.hpp"

namespace lockstep::testing {
namespace {

using DeviceBadLabels = OnDevice;
LOCKSTEP_ON_DEVICES(DeviceBadLabels);

TEST_P(DeviceBadLabels, ABadLabelIsReportedAsSuchByTheGradientCheck) {
  nn::Model model = nn::Model::build("mlp:8", {6}, 3, /*seed=*/1, device());
  auto comm = comm::make_single_rank_communicator();
  parallel::DdpEngine engine(dev(), model, *comm, {});
  Tensor x = random_tensor({4, 6}, 3);
  Tensor y = Tensor::from_vector<std::int32_t>({0, 2, 7, 1}, {4});  // 7: only 3 classes
  engine.begin_step();
  engine.forward_backward(x, y, 0.25f, true);
  engine.finish_gradients();
  try {
    (void)engine.check_gradients(*engine.flat_params(), false);
    FAIL() << "the bad label went unreported";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("label 7 in row 2 is outside [0, 3)"), std::string::npos) << what;
    EXPECT_EQ(what.find("non-finite"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace lockstep::testing

#endif  // __has_include("lockstep/parallel/ddp.hpp")
