#include "lockstep/data/tokenizer.hpp"

#include <cstdlib>
#include <filesystem>

#include "gpt2_tokenizer.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/core/utf8.hpp"

namespace lockstep::data {

namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";

// Every byte is a token. Byte 0 doubles as end-of-text, so text holding a NUL is refused: the
// vocabulary stays 256 (one byte of storage would do) and a document boundary is unambiguous.
class BytesTokenizer final : public Tokenizer {
 public:
  const std::string& name() const override { return name_; }
  std::int64_t vocab_size() const override { return 256; }
  std::int32_t eot_token() const override { return 0; }
  void encode(std::string_view text, std::vector<std::int32_t>& out) const override {
    check_utf8(text, "text");
    const auto nul = text.find('\0');
    LOCKSTEP_CHECK_HINT(nul == std::string_view::npos,
                        "remove NUL bytes from the text, or use --tokenizer=gpt2",
                        "text holds a NUL byte at offset ", nul,
                        ", which the bytes tokenizer reserves for end-of-text");
    out.reserve(out.size() + text.size());
    for (char c : text)
      out.push_back(static_cast<unsigned char>(c));
  }
  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (auto id : ids) {
      LOCKSTEP_CHECK(id >= 0 && id < 256, "bytes tokenizer: cannot decode token ", id,
                     ", outside [0, 256)");
      out += static_cast<char>(id);
    }
    return out;
  }

 private:
  std::string name_ = "bytes";
};

}  // namespace

std::vector<std::int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  encode(text, out);
  return out;
}

std::vector<std::int32_t> Tokenizer::encode_with_special(std::string_view text) const {
  std::vector<std::int32_t> out;
  for (;;) {
    const auto at = text.find(kEndOfText);
    encode(text.substr(0, at), out);
    if (at == std::string_view::npos) return out;
    out.push_back(eot_token());
    text.remove_prefix(at + kEndOfText.size());
  }
}

std::string default_gpt2_dir() {
  if (const char* d = std::getenv("LOCKSTEP_GPT2_DIR"); d && *d) return d;
  std::string cache;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    cache = x;
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    cache = std::string(h) + "/.cache";
  } else {
    cache = ".cache";
  }
  return cache + "/lockstep/gpt2";
}

bool gpt2_files_present(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(dir + "/" + kGpt2RankFile, ec)) return true;
  return std::filesystem::is_regular_file(dir + "/encoder.json", ec) &&
         std::filesystem::is_regular_file(dir + "/vocab.bpe", ec);
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& gpt2_dir) {
  if (name == "bytes") return std::make_unique<BytesTokenizer>();
  if (name == "gpt2") return gpt2::load(gpt2_dir.empty() ? default_gpt2_dir() : gpt2_dir);
  LOCKSTEP_FAIL_HINT("the tokenizers are: bytes, gpt2", "unknown tokenizer '", name, "'");
}

void check_utf8(std::string_view text, const std::string& where) {
  std::size_t line = 1, line_start = 0;
  for (std::size_t i = 0; i < text.size();) {
    char32_t cp;
    const int len = utf8::decode(text, i, cp);
    if (len == 0) {
      LOCKSTEP_FAIL_HINT("convert it to UTF-8 first, e.g. iconv -f latin1 -t utf-8", where,
                         " is not UTF-8: byte 0x", std::hex,
                         static_cast<int>(static_cast<unsigned char>(text[i])), std::dec,
                         " at byte offset ", i, " (line ", line, ", column ", i - line_start + 1,
                         ") does not start a well-formed UTF-8 sequence");
    }
    if (cp == '\n') line += 1, line_start = i + 1;
    i += static_cast<std::size_t>(len);
  }
}

}  // namespace lockstep::data
