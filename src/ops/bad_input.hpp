// The errors for a label or token id outside its range, worded once for every backend: the CPU
// checks its inputs on the host before a kernel runs; the CUDA backend records the first bad one
// on the device and raises it the next time it reads anything back (cuda_backend.cpp), so that it
// surfaces before a caller reads the NaNs it caused as "non-finite gradient".
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/core/error.hpp"

namespace lockstep::ops {

inline constexpr const char* kBadLabelHint =
    "labels must be class indices in [0, num_classes): check the dataset's num_classes against "
    "the model's output layer";
inline constexpr const char* kBadTokenHint =
    "token ids must be below the model's vocab: check the data's vocabulary size (num_classes) "
    "against the model spec";

// `op` names the op and, off the CPU, the device ("softmax_xent_forward on cuda:0").
inline std::string bad_label_message(const std::string& op, std::int32_t label, std::int64_t row,
                                     std::int64_t classes) {
  return str(op, ": label ", label, " in row ", row, " is outside [0, ", classes, ")");
}

// `position` counts over the [batch, positions] token tensor, row-major.
inline std::string bad_token_message(const std::string& op, std::int32_t token,
                                     std::int64_t position, std::int64_t positions,
                                     std::int64_t vocab) {
  return str(op, ": token id ", token, " at [", position / positions, ", ", position % positions,
             "] is outside [0, ", vocab, ")");
}

}  // namespace lockstep::ops
