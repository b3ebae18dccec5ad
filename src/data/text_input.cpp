#include "text_input.hpp"

#include <zlib.h>
#include <zstd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "lockstep/core/error.hpp"
#include "lockstep/core/json.hpp"

namespace lockstep::data {

namespace {

// Compressed input is read in blocks of this size; decompressed text comes out in the caller's.
constexpr std::size_t kInputBlock = std::size_t{1} << 20;

// The file's own bytes: a FILE* (stdin for "-").
class RawFile {
 public:
  explicit RawFile(const std::string& path) : path_(path) {
    if (path == "-") {
      file_ = stdin;
      return;
    }
    file_ = std::fopen(path.c_str(), "rb");
    LOCKSTEP_CHECK(file_ != nullptr, "cannot read text file ", path, ": ", std::strerror(errno));
  }
  ~RawFile() {
    if (file_ && file_ != stdin) std::fclose(file_);
  }
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;

  std::size_t read(char* buf, std::size_t n) {
    const std::size_t got = std::fread(buf, 1, n, file_);
    LOCKSTEP_CHECK(got == n || !std::ferror(file_), "error while reading text file ", path_, ": ",
                   std::strerror(errno));
    consumed_ += static_cast<std::int64_t>(got);
    return got;
  }
  std::int64_t consumed() const { return consumed_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::int64_t consumed_ = 0;
};

// The first bytes of a file, read to tell its kind, are handed out before the rest.
class PlainSource final : public TextSource {
 public:
  PlainSource(std::unique_ptr<RawFile> file, std::string head)
      : file_(std::move(file)), head_(std::move(head)) {}
  std::size_t read(char* buf, std::size_t n) override {
    if (at_ < head_.size()) {
      const std::size_t k = std::min(n, head_.size() - at_);
      std::memcpy(buf, head_.data() + at_, k);
      at_ += k;
      return k;
    }
    return file_->read(buf, n);
  }
  std::int64_t consumed() const override { return file_->consumed(); }
  const char* kind() const override { return "plain"; }

 private:
  std::unique_ptr<RawFile> file_;
  std::string head_;
  std::size_t at_ = 0;
};

const char* kCompressedHint = "check the file (gzip -t / zstd -t), or fetch it again";

class GzipSource final : public TextSource {
 public:
  GzipSource(std::unique_ptr<RawFile> file, std::string head)
      : file_(std::move(file)), in_(head.begin(), head.end()) {
    in_.reserve(kInputBlock);
    z_.next_in = reinterpret_cast<Bytef*>(in_.data());
    z_.avail_in = static_cast<uInt>(in_.size());
    LOCKSTEP_CHECK(inflateInit2(&z_, 16 + MAX_WBITS) == Z_OK, "zlib: cannot start inflating ",
                   file_->path());
  }
  ~GzipSource() override { inflateEnd(&z_); }

  std::size_t read(char* buf, std::size_t n) override {
    z_.next_out = reinterpret_cast<Bytef*>(buf);
    z_.avail_out = static_cast<uInt>(n);
    while (z_.avail_out == n && !done_) {
      if (z_.avail_in == 0 && !refill()) {
        LOCKSTEP_CHECK_HINT(!in_member_, kCompressedHint, file_->path(),
                            ": the gzip stream is truncated at compressed byte offset ",
                            file_->consumed());
        done_ = true;
        break;
      }
      in_member_ = true;
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        in_member_ = false;
        inflateReset(&z_);  // another member may follow (cat a.gz b.gz)
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        LOCKSTEP_FAIL_HINT(kCompressedHint, file_->path(),
                           ": not a valid gzip stream at compressed ", "byte offset ",
                           file_->consumed() - z_.avail_in, " (zlib: ", z_.msg ? z_.msg : "error",
                           ")");
      }
    }
    return n - z_.avail_out;
  }
  std::int64_t consumed() const override { return file_->consumed(); }
  const char* kind() const override { return "gzip"; }

 private:
  bool refill() {
    in_.resize(kInputBlock);
    in_.resize(file_->read(in_.data(), in_.size()));
    z_.next_in = reinterpret_cast<Bytef*>(in_.data());
    z_.avail_in = static_cast<uInt>(in_.size());
    return !in_.empty();
  }
  std::unique_ptr<RawFile> file_;
  std::vector<char> in_;
  z_stream z_{};
  bool in_member_ = false, done_ = false;
};

class ZstdSource final : public TextSource {
 public:
  ZstdSource(std::unique_ptr<RawFile> file, std::string head)
      : file_(std::move(file)), in_(head.begin(), head.end()), dctx_(ZSTD_createDCtx()) {
    LOCKSTEP_CHECK(dctx_ != nullptr, "zstd: cannot create a decompression context");
    in_buf_ = {in_.data(), in_.size(), 0};
  }
  ~ZstdSource() override { ZSTD_freeDCtx(dctx_); }

  std::size_t read(char* buf, std::size_t n) override {
    ZSTD_outBuffer out{buf, n, 0};
    while (out.pos == 0) {
      if (in_buf_.pos == in_buf_.size) {
        in_.resize(kInputBlock);
        in_.resize(file_->read(in_.data(), in_.size()));
        in_buf_ = {in_.data(), in_.size(), 0};
        if (in_.empty()) {
          LOCKSTEP_CHECK_HINT(frame_done_, kCompressedHint, file_->path(),
                              ": the zstd stream is truncated at compressed byte offset ",
                              file_->consumed());
          return 0;
        }
      }
      const std::size_t rc = ZSTD_decompressStream(dctx_, &out, &in_buf_);
      LOCKSTEP_CHECK_HINT(!ZSTD_isError(rc), kCompressedHint, file_->path(),
                          ": not a valid zstd stream at compressed byte offset ",
                          file_->consumed() - static_cast<std::int64_t>(in_buf_.size - in_buf_.pos),
                          " (zstd: ", ZSTD_getErrorName(rc), ")");
      frame_done_ = rc == 0;
    }
    return out.pos;
  }
  std::int64_t consumed() const override { return file_->consumed(); }
  const char* kind() const override { return "zstd"; }

 private:
  std::unique_ptr<RawFile> file_;
  std::vector<char> in_;
  ZSTD_DCtx* dctx_;
  ZSTD_inBuffer in_buf_{};
  bool frame_done_ = true;
};

}  // namespace

std::unique_ptr<TextSource> open_text_source(const std::string& path) {
  auto file = std::make_unique<RawFile>(path);
  std::string head(4, '\0');
  std::size_t got = 0;
  while (got < head.size()) {
    const std::size_t k = file->read(head.data() + got, head.size() - got);
    if (k == 0) break;
    got += k;
  }
  head.resize(got);
  const auto starts = [&](std::string_view magic) { return head.rfind(magic, 0) == 0; };
  if (starts("\x1f\x8b")) return std::make_unique<GzipSource>(std::move(file), std::move(head));
  if (starts("\x28\xb5\x2f\xfd"))
    return std::make_unique<ZstdSource>(std::move(file), std::move(head));
  return std::make_unique<PlainSource>(std::move(file), std::move(head));
}

std::int64_t input_size(const std::string& path) {
  if (path == "-") return -1;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? -1 : static_cast<std::int64_t>(size);
}

void json_string_field(std::string_view line, std::string_view field, std::string& out,
                       const std::string& where) {
  constexpr std::string_view kHint =
      "give the field that holds each record's text with --jsonl-field";
  const json::Source source{where, "not a JSON Lines record",
                            "each line must be one JSON object holding the field as a string "
                            "(JSON Lines)",
                            true};
  json::Reader j(line, source);
  j.expect('{', "expected '{'");
  bool found = false;
  std::string key;
  if (!j.take('}')) {
    for (;;) {
      j.string(&key);
      j.expect(':', "expected ':'");
      if (!found && key == field) {
        if (!j.at('"'))
          LOCKSTEP_FAIL_HINT(std::string(kHint), where, ": field \"", field, "\" is not a string");
        j.string(&out);
        found = true;
      } else {
        j.skip_value();
      }
      if (j.take(',')) continue;
      j.expect('}', "expected ',' or '}'");
      break;
    }
  }
  if (!j.at_end()) j.fail("text after the object");
  LOCKSTEP_CHECK_HINT(found, std::string(kHint), where, ": the JSON Lines record has no field \"",
                      field, "\"");
}

}  // namespace lockstep::data
