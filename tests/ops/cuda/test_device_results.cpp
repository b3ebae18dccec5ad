// What a device reports back, on every device kind (the emulated GPU everywhere, CUDA where a GPU
// answers): a bad label or token is found by the kernel, on the device, and reported by the next
// host wait with the CPU backend's words, once (count_correct's own read-back among them); and
// reading a value after an embedding waits for the device once (the bad-token word travels with the
// result words on CUDA).
#include "lockstep/core/error.hpp"
#include "support/device_test_support.hpp"

namespace lockstep::testing {
namespace {

using DeviceResults = OnDevice;
LOCKSTEP_ON_DEVICES(DeviceResults);

TEST_P(DeviceResults, LabelOutsideTheClassesIsAnErrorByTheNextSynchronize) {
  Tensor logits = to_dev(random_tensor({4, 3}, 130));
  Tensor labels = to_dev(Tensor::from_vector<std::int32_t>({0, 2, 3, 1}, {4}));
  Tensor probs = Tensor::empty({4, 3}, DType::F32, device());
  Tensor loss = Tensor::empty({1}, DType::F32, device());
  try {
    ops::softmax_xent_forward(dev(), logits, labels, probs, loss);
    dev().synchronize();
    FAIL() << "label 3 with 3 classes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 3 in row 2 is outside [0, 3)"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(dev().synchronize()) << "the error is reported once";
}

// Evaluation counts hits without a loss before it: count_correct itself reports a bad label (on
// CUDA it once read back an accuracy, counting the row as a miss), and counts as the CPU after.
TEST_P(DeviceResults, CountCorrectReportsALabelOutsideTheClasses) {
  Tensor logits = random_tensor({6, 4}, 4);
  for (std::int32_t bad : {4, -1}) {
    Tensor labels = Tensor::from_vector<std::int32_t>({0, 3, 1, 2, bad, bad}, {6});
    try {
      ops::count_correct(dev(), to_dev(logits), to_dev(labels));
      ADD_FAILURE() << "label " << bad << " with 4 classes was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("count_correct"), std::string::npos) << msg;
      EXPECT_NE(msg.find("label " + std::to_string(bad) + " in row 4 is outside [0, 4)"),
                std::string::npos)
          << msg;
    }
  }
  Tensor labels = Tensor::from_vector<std::int32_t>({0, 3, 1, 2, 1, 0}, {6});
  EXPECT_EQ(ops::count_correct(dev(), to_dev(logits), to_dev(labels)),
            ops::count_correct(cpu(), logits, labels));
}

TEST_P(DeviceResults, TokenOutsideTheVocabularyIsReportedByTheNextSynchronize) {
  Tensor tok = Tensor::from_vector(std::vector<std::int32_t>{1, 2, 3, 40}, {2, 2});
  Tensor wte = to_dev(random_tensor({5, 4}, 1)), wpe = to_dev(random_tensor({2, 4}, 2));
  Tensor y = Tensor::empty({2, 2, 4}, DType::F32, device());
  ops::embedding_forward(dev(), to_dev(tok), wte, wpe, y);
  try {
    dev().synchronize();
    ADD_FAILURE() << "expected a bad-token error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 40 at [1, 1] is outside [0, 5)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(dev().synchronize()) << "the error is reported once";
}

TEST_P(DeviceResults, ReadingAValueAfterAnEmbeddingWaitsForTheDeviceOnce) {
  Tensor tok = to_dev(Tensor::from_vector(std::vector<std::int32_t>{1, 2, 3, 4}, {2, 2}));
  Tensor wte = to_dev(random_tensor({5, 4}, 1)), wpe = to_dev(random_tensor({2, 4}, 2));
  Tensor y = Tensor::empty({2, 2, 4}, DType::F32, device());
  ops::embedding_forward(dev(), tok, wte, wpe, y);
  dev().synchronize();
  ops::embedding_forward(dev(), tok, wte, wpe, y);
  const std::uint64_t before = counters().host_syncs;
  const double sum = ops::sum_squares(dev(), y);
  EXPECT_EQ(counters().host_syncs, before + 1);
  EXPECT_NEAR(sum, ops::sum_squares(cpu(), y.to(Device::cpu())), 1e-6 * sum);
}

}  // namespace
}  // namespace lockstep::testing
