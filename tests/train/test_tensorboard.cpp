// The event-file writer's framing, checked against the published CRC-32C check value and by
// reading a file back record by record. tests/scripts/tensorboard_events.sh reads the files of a
// real run with TensorBoard's own reader.
#include "lockstep/train/tensorboard.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "lockstep/core/error.hpp"
#include "support/temp_dir.hpp"

namespace lockstep::train {
namespace {

TEST(TensorBoard, Crc32cGivesTheCastagnoliCheckValue) {
  // The check value of CRC-32C (RFC 3720 B.4, and every CRC catalogue): "123456789".
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  // 32 zero bytes: RFC 3720's first test vector.
  const unsigned char zeros[32] = {};
  EXPECT_EQ(crc32c(zeros, 32), 0x8a9136aau);
}

TEST(TensorBoard, EveryRecordIsFramedWithMaskedCrcs) {
  test::TempDir dir;
  std::string path;
  {
    TensorBoardFile tb(dir.path() + "/tb", 0);
    path = tb.path();
    EXPECT_NE(std::filesystem::path(path).filename().string().find("events.out.tfevents."),
              std::string::npos);
    tb.write(JsonRecord().add("step", 10).add("loss", 0.5).add("epoch", 0));
    tb.write(JsonRecord().add("event", "eval").add("step", 10).add("val_loss", 0.25));
    tb.write(JsonRecord().add("event", "final").add("steps", 10));  // no step: no event
  }
  const std::string bytes = test::file_bytes(path);
  std::vector<std::string> records;
  for (std::size_t at = 0; at < bytes.size();) {
    ASSERT_LE(at + 12, bytes.size());
    std::uint64_t length;
    std::uint32_t length_crc, data_crc;
    std::memcpy(&length, bytes.data() + at, 8);
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    EXPECT_EQ(length_crc, masked_crc32c(bytes.data() + at, 8));
    ASSERT_LE(at + 12 + length + 4, bytes.size());
    const std::string data = bytes.substr(at + 12, length);
    std::memcpy(&data_crc, bytes.data() + at + 12 + length, 4);
    EXPECT_EQ(data_crc, masked_crc32c(data.data(), data.size()));
    records.push_back(data);
    at += 12 + length + 4;
  }
  ASSERT_EQ(records.size(), 3u);  // the file version, then one event per record with a step
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(records[1].find("train/loss"), std::string::npos);
  EXPECT_EQ(records[1].find("train/epoch"), std::string::npos);
  EXPECT_NE(records[2].find("eval/val_loss"), std::string::npos);
}

TEST(TensorBoard, AFolderThatCannotBeMadeIsAnErrorNamingTheKey) {
  test::TempDir dir;
  std::ofstream(dir.path() + "/file") << "x";
  try {
    TensorBoardFile tb(dir.path() + "/file/tb", 0);
    FAIL() << "expected an error";
  } catch (const lockstep::Error& e) {
    EXPECT_NE(std::string(e.what()).find("log.tensorboard"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::train
