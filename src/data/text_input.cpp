#include "text_input.hpp"

#include <zlib.h>
#include <zstd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "lockstep/core/error.hpp"
#include "utf8.hpp"

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

// A strict reader of one JSON value at a time: enough to find one string field of a record and
// to skip every other value, nested ones included.
namespace {

class JsonLine {
 public:
  JsonLine(std::string_view text, const std::string& where) : s_(text), where_(where) {}

  [[noreturn]] void fail(const char* what) const {
    LOCKSTEP_FAIL_HINT(
        "each line must be one JSON object holding the field as a string (JSON Lines)", where_,
        ": not a JSON Lines record: ", what, " at column ", i_ + 1);
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n'))
      ++i_;
  }
  bool at(char c) {
    ws();
    return i_ < s_.size() && s_[i_] == c;
  }
  void expect(char c, const char* what) {
    if (!at(c)) fail(what);
    ++i_;
  }
  bool at_end() {
    ws();
    return i_ == s_.size();
  }

  // A string at i_; its unescaped text into out when out is given.
  void string(std::string* out) {
    expect('"', "expected a string");
    if (out) out->clear();
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character in a string");
      if (c != '\\') {
        if (out) *out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      const char e = s_[i_++];
      char plain = 0;
      switch (e) {
        case '"':
        case '\\':
        case '/':
          plain = e;
          break;
        case 'b':
          plain = '\b';
          break;
        case 'f':
          plain = '\f';
          break;
        case 'n':
          plain = '\n';
          break;
        case 'r':
          plain = '\r';
          break;
        case 't':
          plain = '\t';
          break;
        case 'u': {
          char32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (i_ + 2 > s_.size() || s_[i_] != '\\' || s_[i_ + 1] != 'u')
              fail("a lone surrogate \\u escape");
            i_ += 2;
            const char32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("a bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("a lone surrogate \\u escape");
          }
          if (out) utf8::append(*out, cp);
          continue;
        }
        default:
          fail("an unknown escape");
      }
      if (out) *out += plain;
    }
  }

  // Any value, skipped; `depth` bounds nesting so a hostile line cannot overflow the stack.
  void skip_value(int depth = 0) {
    if (depth > 256) fail("nesting deeper than 256");
    ws();
    if (i_ >= s_.size()) fail("expected a value");
    const char c = s_[i_];
    if (c == '"') return string(nullptr);
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++i_;
      if (at(close)) {
        ++i_;
        return;
      }
      for (;;) {
        if (close == '}') {
          string(nullptr);
          expect(':', "expected ':'");
        }
        skip_value(depth + 1);
        if (at(',')) {
          ++i_;
          continue;
        }
        expect(close, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
        return;
      }
    }
    for (std::string_view word : {"true", "false", "null"}) {
      if (s_.substr(i_, word.size()) == word) {
        i_ += word.size();
        return;
      }
    }
    const std::size_t start = i_;  // a number, loosely: its characters
    while (i_ < s_.size() && std::strchr("+-0123456789.eE", s_[i_]) && s_[i_] != '\0')
      ++i_;
    if (i_ == start) fail("expected a value");
  }

 private:
  char32_t hex4() {
    if (i_ + 4 > s_.size()) fail("a truncated \\u escape");
    char32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<char32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<char32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<char32_t>(c - 'A' + 10);
      else
        fail("a bad \\u escape");
    }
    return v;
  }

  std::string_view s_;
  const std::string& where_;
  std::size_t i_ = 0;
};

}  // namespace

void json_string_field(std::string_view line, std::string_view field, std::string& out,
                       const std::string& where) {
  JsonLine j(line, where);
  j.expect('{', "expected '{'");
  bool found = false;
  std::string key;
  if (j.at('}')) {
    j.expect('}', "");
  } else {
    for (;;) {
      j.string(&key);
      j.expect(':', "expected ':'");
      if (!found && key == field) {
        if (!j.at('"')) {
          LOCKSTEP_FAIL_HINT("give the field that holds each record's text with --jsonl-field",
                             where, ": field \"", field, "\" is not a string");
        }
        j.string(&out);
        found = true;
      } else {
        j.skip_value();
      }
      if (j.at(',')) {
        j.expect(',', "");
        continue;
      }
      j.expect('}', "expected ',' or '}'");
      break;
    }
  }
  if (!j.at_end()) j.fail("text after the object");
  LOCKSTEP_CHECK_HINT(found, "give the field that holds each record's text with --jsonl-field",
                      where, ": the JSON Lines record has no field \"", field, "\"");
}

}  // namespace lockstep::data
