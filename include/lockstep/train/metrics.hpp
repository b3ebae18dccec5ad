// Outputs of a run: the JSON-lines metrics file (one object per line, machine-readable, what the
// plots and benchmarks read) and the human progress display (a live line with ETA on a terminal,
// plain lines in a file such as a Slurm log). Only rank 0 writes either unless asked otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::train {

// A flat JSON object built field by field: {"step": 10, "loss": 0.5, "event": "final"}.
class JsonRecord {
 public:
  JsonRecord& add(const std::string& key, double value);
  JsonRecord& add(const std::string& key, std::int64_t value);
  JsonRecord& add(const std::string& key, int value) {
    return add(key, static_cast<std::int64_t>(value));
  }
  JsonRecord& add(const std::string& key, const std::string& value);
  JsonRecord& add(const std::string& key, const char* value) {
    return add(key, std::string(value));
  }
  JsonRecord& add(const std::string& key, bool value);
  JsonRecord& add_raw(const std::string& key, const std::string& json);  // an already-JSON value
  std::string str() const;

  // The numeric fields (finite or not) in order, and a string field's text ("" if none): what
  // other sinks of the same record (TensorBoard) read.
  const std::vector<std::pair<std::string, double>>& numbers() const { return numbers_; }
  std::string text(const std::string& key) const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
  std::vector<std::pair<std::string, double>> numbers_;
  std::vector<std::pair<std::string, std::string>> texts_;
};

std::string json_escape(const std::string& text);

// log.metrics. A run that starts from step 0 truncates it; a run that continues from a
// checkpoint appends (Append), so a requeued job keeps every earlier start's records, and the
// caller marks the seam with a restart record (docs/CHECKPOINTS.md).
class MetricsFile {
 public:
  enum class Mode { Truncate, Append };
  MetricsFile() = default;
  // Creates parent folders. Append completes a last line cut short by a killed writer first.
  explicit MetricsFile(const std::string& path, Mode mode = Mode::Truncate);
  bool enabled() const { return out_.is_open(); }
  // Opened with Append onto earlier records (the file was not empty).
  bool continues() const { return continues_; }
  void write(const JsonRecord& record);  // one line, flushed (a killed job keeps what it logged)

 private:
  std::ofstream out_;
  std::string path_;
  bool continues_ = false;
};

enum class ProgressMode { Bar, Lines, None };
// "auto" -> Bar when stderr is a terminal, else Lines.
ProgressMode parse_progress_mode(const std::string& text);

class Progress {
 public:
  Progress(ProgressMode mode, std::int64_t total_steps, std::string prefix = "");
  // Called every log interval.
  void step(std::int64_t step, std::int64_t epoch, double loss, double lr, double samples_per_s);
  // A line that must stay visible (evaluation results, warnings, final summary).
  void line(const std::string& text);
  void finish();

 private:
  ProgressMode mode_;
  std::int64_t total_;
  std::string prefix_;
  std::chrono::steady_clock::time_point start_;
  bool bar_open_ = false;
};

std::string format_duration(double seconds);  // "1h02m", "3m07s", "12s"

}  // namespace lockstep::train
