#include "lockstep/train/metrics.hpp"

#include <unistd.h>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "lockstep/core/error.hpp"

namespace lockstep::train {

std::string json_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 2);
  for (char ch : text) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out;
}

JsonRecord& JsonRecord::add(const std::string& key, double value) {
  numbers_.emplace_back(key, value);
  if (!std::isfinite(value)) return add_raw(key, "null");  // JSON has no NaN/Inf
  std::ostringstream s;
  s << std::setprecision(7) << value;
  return add_raw(key, s.str());
}
JsonRecord& JsonRecord::add(const std::string& key, std::int64_t value) {
  numbers_.emplace_back(key, static_cast<double>(value));
  return add_raw(key, std::to_string(value));
}
JsonRecord& JsonRecord::add(const std::string& key, const std::string& value) {
  texts_.emplace_back(key, value);
  // Built by appending: GCC 12 warns falsely (-Wrestrict, PR105329) on "lit" + std::string&&.
  std::string quoted(1, '"');
  quoted += json_escape(value);
  quoted += '"';
  return add_raw(key, quoted);
}
JsonRecord& JsonRecord::add(const std::string& key, bool value) {
  return add_raw(key, value ? "true" : "false");
}
JsonRecord& JsonRecord::add_raw(const std::string& key, const std::string& json) {
  fields_.emplace_back(key, json);
  return *this;
}
std::string JsonRecord::text(const std::string& key) const {
  for (const auto& [k, v] : texts_)
    if (k == key) return v;
  return "";
}
std::string JsonRecord::str() const {
  std::string out = "{";
  for (std::size_t i = 0; i < fields_.size(); ++i) {
    if (i) out += ", ";
    out += '"';
    out += json_escape(fields_[i].first);
    out += "\": ";
    out += fields_[i].second;
  }
  out += '}';
  return out;
}

MetricsFile::MetricsFile(const std::string& path, Mode mode) : path_(path) {
  std::filesystem::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  LOCKSTEP_CHECK_HINT(!ec, "check log.metrics and the folder's permissions", "metrics file '", path,
                      "': cannot create its folder: ", ec.message());
  char last = '\n';  // of the earlier records, when appending
  if (mode == Mode::Append) {
    std::ifstream earlier(path, std::ios::binary | std::ios::ate);
    if (earlier && earlier.tellg() > 0) {
      continues_ = true;
      earlier.seekg(-1, std::ios::end);
      earlier.get(last);
    }
  }
  errno = 0;
  out_.open(path, mode == Mode::Append ? std::ios::app : std::ios::trunc);
  LOCKSTEP_CHECK_HINT(out_.is_open(), "check log.metrics and the folder's permissions",
                      "cannot open metrics file '", path, "' for writing",
                      errno ? str(": ", std::strerror(errno)) : std::string());
  if (last != '\n') out_ << '\n';  // a record cut short stays one bad line, not two
}

void MetricsFile::write(const JsonRecord& record) {
  if (!out_.is_open()) return;
  out_ << record.str() << '\n';
  out_.flush();
  LOCKSTEP_CHECK(out_.good(), "writing metrics file '", path_, "' failed (disk full?)");
}

ProgressMode parse_progress_mode(const std::string& text) {
  if (text == "bar") return ProgressMode::Bar;
  if (text == "lines") return ProgressMode::Lines;
  if (text == "none") return ProgressMode::None;
  LOCKSTEP_CHECK(text == "auto", "log.progress: unknown mode '", text, "'");
  return isatty(STDERR_FILENO) ? ProgressMode::Bar : ProgressMode::Lines;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<long long>(std::llround(seconds));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%llds", s);
  return buf;
}

Progress::Progress(ProgressMode mode, std::int64_t total_steps, std::string prefix)
    : mode_(mode),
      total_(total_steps),
      prefix_(std::move(prefix)),
      start_(std::chrono::steady_clock::now()) {}

void Progress::step(std::int64_t step, std::int64_t epoch, double loss, double lr,
                    double samples_per_s) {
  if (mode_ == ProgressMode::None) return;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double eta = step > 0 && total_ > 0
                   ? elapsed / static_cast<double>(step) * static_cast<double>(total_ - step)
                   : NAN;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%sstep %lld/%lld epoch %lld loss %.4f lr %.4g %.0f samples/s elapsed %s eta %s",
                prefix_.c_str(), static_cast<long long>(step), static_cast<long long>(total_),
                static_cast<long long>(epoch), loss, lr, samples_per_s,
                format_duration(elapsed).c_str(), format_duration(eta).c_str());
  if (mode_ == ProgressMode::Bar) {
    int width = 24;
    int filled = total_ > 0 ? static_cast<int>(width * step / total_) : 0;
    std::string bar(1, '[');
    bar.append(static_cast<std::size_t>(filled), '#');
    bar.append(static_cast<std::size_t>(width - filled), '.');
    bar += "] ";
    std::fprintf(stderr, "\r\033[K%s%s", bar.c_str(), buf);
    bar_open_ = true;
  } else {
    std::fprintf(stderr, "%s\n", buf);
  }
  std::fflush(stderr);
}

void Progress::line(const std::string& text) {
  if (mode_ == ProgressMode::None) return;
  if (bar_open_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s%s\n", prefix_.c_str(), text.c_str());
  bar_open_ = false;
  std::fflush(stderr);
}

void Progress::finish() {
  if (bar_open_) std::fprintf(stderr, "\n");
  bar_open_ = false;
}

}  // namespace lockstep::train
