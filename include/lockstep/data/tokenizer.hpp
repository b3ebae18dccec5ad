// Tokenizers turn UTF-8 text into token ids and back. Two exist: `bytes` (every byte is its own
// token, vocabulary 256, end-of-text = byte 0, needs nothing) and `gpt2`, OpenAI's byte-level BPE
// (vocabulary 50257, end-of-text 50256), encoding exactly as tiktoken does, over tiktoken's rank
// file gpt2.tiktoken (which scripts/install-deps.sh --gpt2 fetches) or the published encoder.json
// and vocab.bpe. Encoding is a pure function of the text; decoding returns bytes (a token may end
// inside a multi-byte character).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual const std::string& name() const = 0;  // "bytes" or "gpt2": what token shards record
  virtual std::int64_t vocab_size() const = 0;
  virtual std::int32_t eot_token() const = 0;  // separates documents in a token stream
  // Appends the ids of `text` (valid UTF-8, else an Error naming the byte offset) to out. The
  // text's own "<|endoftext|>" is ordinary text: only encode_with_special turns it into eot.
  virtual void encode(std::string_view text, std::vector<std::int32_t>& out) const = 0;
  // Every id must be in [0, vocab_size).
  virtual std::string decode(std::span<const std::int32_t> ids) const = 0;

  std::vector<std::int32_t> encode(std::string_view text) const;
  // As encode, but each literal "<|endoftext|>" becomes eot_token() (tiktoken's allowed_special).
  std::vector<std::int32_t> encode_with_special(std::string_view text) const;
};

// The folder holding GPT-2's vocabulary: $LOCKSTEP_GPT2_DIR if set, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/lockstep/gpt2 (where scripts/install-deps.sh --gpt2 puts it).
std::string default_gpt2_dir();
// The command that fetches it, for hints and skipped tests.
inline constexpr const char* kGpt2FetchCommand = "scripts/install-deps.sh --gpt2";
// tiktoken's rank file of GPT-2 (as openai-whisper ships it); read first when present.
inline constexpr const char* kGpt2RankFile = "gpt2.tiktoken";
// True when dir holds gpt2.tiktoken, or both encoder.json and vocab.bpe.
bool gpt2_files_present(const std::string& dir = default_gpt2_dir());

// "bytes" or "gpt2" (reading its files from gpt2_dir, default_gpt2_dir() when empty). A missing
// or damaged vocabulary file is an Error naming the file and the command that fetches it.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name,
                                          const std::string& gpt2_dir = "");

// Throws an Error naming `where`, the byte offset, line and column of the first byte that is not
// part of a well-formed UTF-8 sequence (overlong forms, surrogates and > U+10FFFF included).
void check_utf8(std::string_view text, const std::string& where);

}  // namespace lockstep::data
