// The CIFAR-10 and CIFAR-100 binary formats (the "binary version" archives, cifar-10-batches-bin
// and cifar-100-binary) to labeled arrays: a record is the label byte (CIFAR-100: coarse, then
// fine) and 3072 pixel bytes, the red, green and blue 32x32 planes, which is already the shard's
// u8 [3, 32, 32] layout. Errors name the file: a size that is not a whole number of records, a
// label outside the classes, a missing batch.
#pragma once

#include <string>

#include "lockstep/data/importers.hpp"

namespace lockstep::data {

struct CifarSplits {
  std::string kind;          // "cifar-10" or "cifar-100"
  LabeledArray train, test;  // u8 [n, 3, 32, 32], class names when the folder has them
};

// dir holds data_batch_1..5.bin and test_batch.bin (CIFAR-10; names from batches.meta.txt), or
// train.bin and test.bin (CIFAR-100; names from fine_label_names.txt / coarse_label_names.txt).
// coarse: CIFAR-100's 20 superclasses instead of its 100 classes (an error for CIFAR-10).
CifarSplits read_cifar(const std::string& dir, bool coarse = false);

}  // namespace lockstep::data
