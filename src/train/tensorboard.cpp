#include "lockstep/train/tensorboard.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "lockstep/core/error.hpp"

namespace lockstep::train {
namespace {

// Reflected Castagnoli polynomial (0x1EDC6F41 bit-reversed), one byte at a time: an event file
// holds a few hundred bytes per log interval, so a table is fast enough.
const std::array<std::uint32_t, 256>& crc32c_table() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// Protobuf wire format, the few field kinds an Event needs.
void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
template <typename T>
void little_endian(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // x86-64 and aarch64 are little-endian, as the format is
  out.append(bytes, sizeof(T));
}
enum Wire : std::uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };
void key(std::string& out, std::uint32_t field, Wire wire) {
  varint(out, (field << 3) | wire);
}
void bytes_field(std::string& out, std::uint32_t field, const std::string& bytes) {
  key(out, field, kBytes);
  varint(out, bytes.size());
  out += bytes;
}

// tensorflow.Event (tensorflow/core/util/event.proto): 1 wall_time (double), 2 step (int64),
// 3 file_version (string), 5 summary (Summary), 7 session_log (SessionLog).
std::string event_header(std::int64_t step) {
  std::string e;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  key(e, 1, kFixed64);
  little_endian(e, now);
  key(e, 2, kVarint);
  varint(e, static_cast<std::uint64_t>(step));
  return e;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t bytes) {
  const auto& table = crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < bytes; ++i)
    c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(const void* data, std::size_t bytes) {
  const std::uint32_t c = crc32c(data, bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardFile::TensorBoardFile(const std::string& dir, std::int64_t restart_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  LOCKSTEP_CHECK_HINT(!ec, "name a folder that can be written, or leave log.tensorboard empty",
                      "log.tensorboard = ", dir, ": cannot create the folder: ", ec.message());
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  // TensorBoard's own name (EventFileWriter): the time orders a folder's files, so a continued
  // run's file comes after the one it continues; the pid keeps two starts in one second apart.
  path_ = (std::filesystem::path(dir) / str("events.out.tfevents.", now, ".", host, ".", getpid()))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  LOCKSTEP_CHECK_HINT(file_ != nullptr,
                      "name a folder that can be written, or leave log.tensorboard empty",
                      "log.tensorboard: cannot create ", path_, ": ", std::strerror(errno));
  std::string version = event_header(0);
  bytes_field(version, 3, "brain.Event:2");
  record(version);
  if (restart_step > 0) {
    // SessionLog {status = START (1)}: TensorBoard purges the folder's records at and after
    // this step that an earlier file holds (its purge_orphaned_data, on by default).
    std::string session_log;
    key(session_log, 1, kVarint);
    varint(session_log, 1);
    std::string restart = event_header(restart_step);
    bytes_field(restart, 7, session_log);
    record(restart);
  }
}

TensorBoardFile::TensorBoardFile(TensorBoardFile&& other) noexcept
    : file_(std::exchange(other.file_, nullptr)), path_(std::move(other.path_)) {}
TensorBoardFile& TensorBoardFile::operator=(TensorBoardFile&& other) noexcept {
  if (this != &other) {
    if (file_) std::fclose(file_);
    file_ = std::exchange(other.file_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}
TensorBoardFile::~TensorBoardFile() {
  if (file_) std::fclose(file_);
}

void TensorBoardFile::record(const std::string& event) {
  std::string framed;
  const std::uint64_t length = event.size();
  little_endian(framed, length);
  little_endian(framed, masked_crc32c(framed.data(), 8));
  framed += event;
  little_endian(framed, masked_crc32c(event.data(), event.size()));
  const bool ok = std::fwrite(framed.data(), 1, framed.size(), file_) == framed.size() &&
                  std::fflush(file_) == 0;
  LOCKSTEP_CHECK(ok, "log.tensorboard: cannot write ", path_, ": ", std::strerror(errno));
}

void TensorBoardFile::scalars(std::int64_t step,
                              const std::vector<std::pair<std::string, double>>& values) {
  if (!enabled() || values.empty()) return;
  // Summary: 1 value (repeated Summary.Value: 1 tag, 2 simple_value as float).
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    bytes_field(value, 1, tag);
    key(value, 2, kFixed32);
    little_endian(value, static_cast<float>(v));
    bytes_field(summary, 1, value);
  }
  std::string event = event_header(step);
  bytes_field(event, 5, summary);
  record(event);
}

void TensorBoardFile::write(const JsonRecord& record) {
  if (!enabled()) return;
  const std::string event = record.text("event");
  const std::string group = event.empty() ? "train" : event;
  std::int64_t step = -1;
  std::vector<std::pair<std::string, double>> values;
  for (const auto& [k, v] : record.numbers()) {
    if (k == "step")
      step = static_cast<std::int64_t>(v);
    else if (k != "epoch")
      values.emplace_back(group + "/" + k, v);
  }
  if (step >= 0) scalars(step, values);
}

}  // namespace lockstep::train
