// Evaluation of the model on a held-out set, every sample counted exactly once over all ranks:
// rank r evaluates samples r, r+W, r+2W, ... (no padding), then the sums are reduced. Leaves the
// model in training mode. Collective over run.comm.
#pragma once

#include <cstdint>

#include "lockstep/train/setup.hpp"

namespace lockstep::train {

// Means over label rows: one per sample for images, one per position for token windows (so the
// loss is per token and the accuracy is next-token accuracy).
struct EvalResult {
  double loss = 0;      // mean softmax cross-entropy per label row
  double accuracy = 0;  // fraction of label rows whose argmax is the label
  std::int64_t samples = 0;
};

EvalResult evaluate(Run& run, const data::Dataset& set);

}  // namespace lockstep::train
