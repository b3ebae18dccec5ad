// log.tensorboard: TensorBoard scalars as standard event files, written by lockstep itself (no
// TensorFlow, no protobuf library). An event file is a sequence of TFRecords, each
//   uint64 length, uint32 masked CRC-32C of those 8 bytes, length bytes of data, uint32 masked
//   CRC-32C of the data   (little-endian; mask: rotate right by 15, add 0xa282ead8)
// whose data is a serialized tensorflow.Event: the first holds file_version "brain.Event:2", each
// later one wall_time, step and a Summary of (tag, simple_value) pairs. The protobuf fields are
// written by hand: only varints, fixed64/fixed32 and length-delimited fields are needed.
// A run that continues from a checkpoint opens a new file in the same folder and begins it with a
// SessionLog START at its first step: TensorBoard then drops the previous file's records from that
// step on (steps the crashed run logged after its checkpoint), so every step is shown once.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/train/metrics.hpp"

namespace lockstep::train {

// CRC-32C (Castagnoli), as TFRecord uses; crc32c("123456789") = 0xe3069283.
std::uint32_t crc32c(const void* data, std::size_t bytes);
// TFRecord's masked form of a CRC-32C (a CRC of data holding CRCs stays well-behaved).
std::uint32_t masked_crc32c(const void* data, std::size_t bytes);

class TensorBoardFile {
 public:
  TensorBoardFile() = default;
  // Creates `dir` and a new events.out.tfevents.<time>.<host>.<pid> file in it (an error naming
  // the folder if it cannot). A run that continues from `restart_step` > 0 marks the restart.
  TensorBoardFile(const std::string& dir, std::int64_t restart_step);
  TensorBoardFile(TensorBoardFile&&) noexcept;
  TensorBoardFile& operator=(TensorBoardFile&&) noexcept;
  ~TensorBoardFile();

  bool enabled() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }
  // One event: the scalars (tag, value) at `step`. Flushed, as the metrics file is.
  void scalars(std::int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // A metrics record's numbers as scalars at its "step": a training interval's fields as
  // "train/<key>", an event's as "<event>/<key>" (eval/val_loss, checkpoint/stall_s). Records
  // without a step (start, final) are not scalars over steps and are left out.
  void write(const JsonRecord& record);

 private:
  void record(const std::string& event);

  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace lockstep::train
