// GPT-2's byte-level BPE (Radford et al. 2019), encoding as tiktoken does, written over token
// ids instead of strings. The vocabulary comes in one of two spellings: tiktoken's rank file
// gpt2.tiktoken (base64 of each token's bytes and its rank) or openai/gpt-2's encoder.json +
// vocab.bpe (each token as a string of "byte characters": bytes_to_unicode shifts the 68
// unprintable bytes to U+0100..U+0143; we undo that at load). Either way a token is its bytes and
// its id is its rank, and the merges are implied: two adjacent tokens merge when their bytes
// together are a token, lowest rank first, so encoding never builds strings.
//
// Encoding a text: split it with the GPT-2 pattern (pretokenize), then run BPE on each piece's
// bytes (bpe() below). Pieces repeat a lot in real text, so their ids are cached.
#include "gpt2_tokenizer.hpp"

#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "lockstep/core/error.hpp"
#include "lockstep/core/json.hpp"
#include "lockstep/core/utf8.hpp"

namespace lockstep::data::gpt2 {

namespace {

constexpr std::int64_t kVocabSize = 50257;
constexpr std::int32_t kEndOfText = 50256;
// Pieces cached before the cache is cleared: bounds memory on a corpus with many distinct words
// (a piece costs about 100 bytes, so a thread's cache stays under about 26 MB) while keeping the
// hit rate of real text above 95%.
// FNV-1a 64 of GPT-2's tokens in rank order, each as its length (one byte) and its bytes: a
// vocabulary file that parses but is not GPT-2's (ranks swapped, a token changed) would encode
// every text wrongly and silently, so it is refused by this check.
constexpr std::uint64_t kGpt2VocabHash = 0xcb475f81e570c65cULL;
std::uint64_t vocabulary_hash(const std::vector<std::string>& tokens, std::size_t count) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto add = [&](unsigned char c) { h = (h ^ c) * 0x100000001b3ULL; };
  for (std::size_t id = 0; id < count; ++id) {
    add(static_cast<unsigned char>(tokens[id].size()));
    for (char c : tokens[id])
      add(static_cast<unsigned char>(c));
  }
  return h;
}
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

// ---- the vocabulary files
const char* kFileHint =
    "fetch GPT-2's vocabulary with scripts/install-deps.sh --gpt2 (gpt2.tiktoken, from PyPI's "
    "openai-whisper), or point LOCKSTEP_GPT2_DIR at a folder holding gpt2.tiktoken, or "
    "encoder.json and vocab.bpe";

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

// encoder.json: one flat JSON object {"token": id, ...}, read with the library's strict reader.
std::vector<std::pair<std::string, std::int64_t>> parse_encoder_json(const std::string& text,
                                                                     const std::string& path) {
  const json::Source source{path, "not GPT-2's encoder.json", kFileHint};
  json::Reader r(text, source);
  std::vector<std::pair<std::string, std::int64_t>> out;
  r.expect('{', "expected '{'");
  if (r.take('}')) return out;
  do {
    std::string key;
    r.string(&key);
    r.expect(':', "expected ':'");
    const std::int64_t id = r.integer();
    if (id < 0) r.fail("a negative token id");
    out.emplace_back(std::move(key), id);
  } while (r.take(','));
  r.expect('}', "expected ',' or '}'");
  if (!r.at_end()) r.fail("text after the object");
  return out;
}

// gpt2.tiktoken: one "base64(token bytes) rank" per line, ranks 0..50255 (tiktoken's format; the
// file openai-whisper ships). A token's id is its rank; end-of-text is not in the file.
std::vector<std::string> read_rank_file(const std::string& path) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::array<int, 256> value{};
  value.fill(-1);
  for (std::size_t k = 0; k < kAlphabet.size(); ++k)
    value[static_cast<unsigned char>(kAlphabet[k])] = static_cast<int>(k);

  std::vector<std::string> tokens(kVocabSize - 1);
  std::vector<bool> seen(kVocabSize - 1, false);
  std::istringstream lines(read_file(path));
  std::string line;
  std::int64_t line_no = 0, count = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (line.empty()) continue;
    const auto space = line.find(' ');
    const std::string_view b64 = std::string_view(line).substr(0, space);
    std::int64_t rank = -1;
    if (space != std::string::npos && space + 1 < line.size() && space + 13 > line.size()) {
      rank = 0;
      for (std::size_t k = space + 1; k < line.size() && rank >= 0; ++k)
        rank = line[k] >= '0' && line[k] <= '9' ? rank * 10 + (line[k] - '0') : -1;
    }
    // Standard base64 with '=' padding, as tiktoken's load_tiktoken_bpe reads it.
    std::string bytes;
    bool ok = rank >= 0 && !b64.empty() && b64.size() % 4 == 0;
    for (std::size_t k = 0; ok && k < b64.size(); k += 4) {
      std::uint32_t group = 0;
      int pad = 0;
      for (std::size_t j = 0; j < 4; ++j) {
        const char c = b64[k + j];
        const bool last_group = k + 4 == b64.size();
        if (c == '=' && last_group && j >= 2 && (j == 3 || b64[k + 3] == '=')) {
          ++pad;
          group <<= 6;
          continue;
        }
        const int v = value[static_cast<unsigned char>(c)];
        ok = ok && v >= 0 && pad == 0;
        group = (group << 6) | static_cast<std::uint32_t>(v < 0 ? 0 : v);
      }
      for (int j = 0; j < 3 - pad; ++j)
        bytes += static_cast<char>((group >> (16 - 8 * j)) & 0xFF);
    }
    LOCKSTEP_CHECK_HINT(ok && !bytes.empty(), kFileHint, path, ": line ", line_no,
                        " is not 'base64 rank' (tiktoken's format): '", line.substr(0, 40), "'");
    LOCKSTEP_CHECK_HINT(rank < kVocabSize - 1 && !seen[static_cast<std::size_t>(rank)], kFileHint,
                        path, ": line ", line_no, " gives rank ", rank, ", outside [0, ",
                        kVocabSize - 1, ") or given twice");
    seen[static_cast<std::size_t>(rank)] = true;
    tokens[static_cast<std::size_t>(rank)] = std::move(bytes);
    ++count;
  }
  LOCKSTEP_CHECK_HINT(count == kVocabSize - 1, kFileHint, path, ": has ", count,
                      " ranks, GPT-2 has ", kVocabSize - 1, " (and end-of-text)");
  return tokens;
}

// encoder.json and vocab.bpe, the files of openai/gpt-2. Their ids are the ranks tiktoken uses:
// the 256 bytes first, then merge k of vocab.bpe makes token 256 + k (tiktoken's
// data_gym_to_mergeable_bpe_ranks asserts the same), which is checked here, so the merges are
// implied by the ids and both sources make the same tokenizer.
std::vector<std::string> read_encoder_json(const std::string& dir) {
  const std::string encoder_path = dir + "/encoder.json";
  const std::string merges_path = dir + "/vocab.bpe";
  const ByteCharDecoder bytes_of;
  std::vector<std::string> tokens(kVocabSize - 1);
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
      continue;
    }
    LOCKSTEP_CHECK_HINT(bytes_of.to_bytes(spelled, bytes), kFileHint, encoder_path, ": token ", id,
                        " '", spelled, "' is not spelled in byte characters");
    tokens[static_cast<std::size_t>(id)] = bytes;
    id_of.emplace(bytes, static_cast<std::int32_t>(id));
  }

  // vocab.bpe: "#version: 0.2", then one merge "A B" per line, in rank order.
  std::istringstream lines(read_file(merges_path));
  std::string line, left, right;
  std::int64_t line_no = 0;
  std::int32_t merge = 0;
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
    LOCKSTEP_CHECK_HINT(ab->second == 256 + merge, kFileHint, merges_path, ": line ", line_no,
                        " makes token ", ab->second, ", but merge ", merge, " must make token ",
                        256 + merge, " (GPT-2's ids are merge ranks)");
    ++merge;
  }
  LOCKSTEP_CHECK_HINT(merge == kVocabSize - 257, kFileHint, merges_path, ": has ", merge,
                      " merges, GPT-2 has ", kVocabSize - 257);
  return tokens;
}

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // tokens[id] = the bytes of token id, for every id but end-of-text; a token's id is its rank.
  Gpt2Tokenizer(std::vector<std::string> tokens, const std::string& source) {
    token_bytes_ = std::move(tokens);
    const std::uint64_t hash = vocabulary_hash(token_bytes_, kVocabSize - 1);
    LOCKSTEP_CHECK_HINT(hash == kGpt2VocabHash, kFileHint, source,
                        ": the vocabulary is not GPT-2's: the hash of its tokens in rank order is ",
                        std::hex, hash, ", GPT-2's is ", kGpt2VocabHash, std::dec,
                        " (FNV-1a 64; a damaged or reordered file?)");
    token_bytes_.resize(kVocabSize);
    token_bytes_[kEndOfText] = "<|endoftext|>";
    id_of_.reserve(kVocabSize);
    for (std::int32_t id = 0; id < kEndOfText; ++id)
      LOCKSTEP_CHECK_HINT(id_of_.emplace(token_bytes_[static_cast<std::size_t>(id)], id).second,
                          kFileHint, source, ": token ", id, " repeats the bytes of token ",
                          id_of_.at(token_bytes_[static_cast<std::size_t>(id)]));
    for (int b = 0; b < 256; ++b) {
      auto it = id_of_.find(std::string(1, static_cast<char>(b)));
      LOCKSTEP_CHECK_HINT(it != id_of_.end(), kFileHint, source, ": no token for byte ", b);
      byte_token_[static_cast<std::size_t>(b)] = it->second;
    }
    // Every way to cut a token into two tokens is a merge of that pair into it.
    merges_.reserve(std::size_t{1} << 19);
    for (std::int32_t id = 0; id < kEndOfText; ++id) {
      const std::string_view t = token_bytes_[static_cast<std::size_t>(id)];
      for (std::size_t cut = 1; cut < t.size(); ++cut) {
        auto a = id_of_.find(t.substr(0, cut)), b = id_of_.find(t.substr(cut));
        if (a != id_of_.end() && b != id_of_.end())
          merges_.emplace(pair_key(a->second, b->second), id);
      }
    }
  }

  const std::string& name() const override { return name_; }
  std::int64_t vocab_size() const override { return kVocabSize; }
  std::int32_t eot_token() const override { return kEndOfText; }

  void encode(std::string_view text, std::vector<std::int32_t>& out) const override {
    check_utf8(text, "text");
    // One cache per thread, so threads encoding documents side by side never wait on each other
    // (`lockstep-shard text --threads`); a thread that switches tokenizers starts afresh.
    thread_local PieceCache cache;
    if (cache.owner != serial_) {
      cache.pieces.clear();
      cache.owner = serial_;
    }
    while (!text.empty()) {
      const std::size_t cut = segment_end(text);
      for (std::string_view piece : pretokenize(text.substr(0, cut))) {
        auto it = cache.pieces.find(piece);
        if (it == cache.pieces.end()) {
          if (cache.pieces.size() >= kCacheEntries) cache.pieces.clear();
          it = cache.pieces.emplace(std::string(piece), bpe(piece)).first;
        }
        out.insert(out.end(), it->second.begin(), it->second.end());
      }
      text.remove_prefix(cut);
    }
  }

  // pretokenize holds about 17 bytes per byte of its text (code points, offsets, classes,
  // pieces), so a long text is encoded in segments of about kSegmentBytes, cut only where the
  // pattern is sure to cut, making the same pieces as the whole: after a "\n" that has an ASCII
  // letter or digit on both sides. There the "\n" is a whitespace run of one character, a piece
  // of its own whether or not text follows it (the run would lose its last character to the next
  // piece only if it were longer), and no piece joins a newline to a letter (only U+0020 may lead
  // a piece of another class). Text without such a place is encoded whole.
  static constexpr std::size_t kSegmentBytes = std::size_t{64} << 10;
  static std::size_t segment_end(std::string_view text) {
    const auto alnum = [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    };
    for (std::size_t i = kSegmentBytes; i < text.size(); ++i) {
      i = text.find('\n', i);
      if (i == std::string_view::npos || i + 1 >= text.size()) break;
      if (alnum(text[i - 1]) && alnum(text[i + 1])) return i + 1;
    }
    return text.size();
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
  static constexpr std::int32_t kNoMerge = std::numeric_limits<std::int32_t>::max();
  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint32_t>(b);
  }
  std::int32_t merged(std::int32_t a, std::int32_t b) const {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? kNoMerge : it->second;
  }

  // tiktoken's byte_pair_encode: a piece that is a token is that token; else, starting from its
  // bytes, merge the leftmost adjacent pair whose union is the lowest-ranked token, one pair at a
  // time, until no pair is a token. (encoder.py merges every occurrence of the best pair at once
  // and knows only vocab.bpe's pairs; the encodings of tests/data/gpt2_known_encodings.inc, made
  // by a port of it, agree, but tiktoken is the reference: tests/scripts/gpt2_reference.sh.)
  std::vector<std::int32_t> bpe(std::string_view piece) const {
    if (auto it = id_of_.find(piece); it != id_of_.end()) return {it->second};
    std::vector<std::int32_t> word;
    word.reserve(piece.size());
    for (char c : piece)
      word.push_back(byte_token_[static_cast<unsigned char>(c)]);
    // rank[i] is the token word[i] and word[i + 1] merge into (its rank, as ids are ranks).
    std::vector<std::int32_t> rank(word.size(), kNoMerge);
    for (std::size_t i = 0; i + 1 < word.size(); ++i)
      rank[i] = merged(word[i], word[i + 1]);
    for (;;) {
      const auto best = std::min_element(rank.begin(), rank.end());  // the leftmost lowest
      if (best == rank.end() || *best == kNoMerge) break;
      const auto i = static_cast<std::size_t>(best - rank.begin());
      word[i] = *best;
      word.erase(word.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      rank.erase(rank.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      rank[i] = i + 1 < word.size() ? merged(word[i], word[i + 1]) : kNoMerge;
      if (i > 0) rank[i - 1] = merged(word[i - 1], word[i]);
    }
    return word;
  }

  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  std::string name_ = "gpt2";
  std::vector<std::string> token_bytes_;        // id -> its bytes ("<|endoftext|>" for eot)
  std::array<std::int32_t, 256> byte_token_{};  // byte -> its one-byte token
  std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>> id_of_;  // bytes -> id
  std::unordered_map<std::uint64_t, std::int32_t> merges_;  // (left id, right id) -> merged id
  struct PieceCache {
    std::uint64_t owner = 0;  // the serial_ of the tokenizer whose pieces these are
    std::unordered_map<std::string, std::vector<std::int32_t>, StringHash, std::equal_to<>> pieces;
  };
  // Unique per tokenizer ever made (an address could be reused by a later one).
  inline static std::atomic<std::uint64_t> next_serial_{1};
  const std::uint64_t serial_ = next_serial_++;
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
  std::error_code ec;
  const std::string ranks = dir + "/" + kGpt2RankFile;
  if (std::filesystem::is_regular_file(ranks, ec))
    return std::make_unique<Gpt2Tokenizer>(read_rank_file(ranks), ranks);
  if (std::filesystem::is_regular_file(dir + "/encoder.json", ec) &&
      std::filesystem::is_regular_file(dir + "/vocab.bpe", ec))
    return std::make_unique<Gpt2Tokenizer>(read_encoder_json(dir), dir + "/encoder.json");
  LOCKSTEP_FAIL_HINT(kFileHint, "the gpt2 tokenizer's vocabulary is missing: no ", ranks,
                     ", nor both ", dir, "/encoder.json and ", dir, "/vocab.bpe");
}

}  // namespace lockstep::data::gpt2
