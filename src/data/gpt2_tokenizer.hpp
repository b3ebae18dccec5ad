// Private to the data layer (and its tests): the GPT-2 tokenizer's pieces, exposed so that the
// pre-tokenisation can be tested on its own.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/data/tokenizer.hpp"

namespace lockstep::data::gpt2 {

// Splits valid UTF-8 text as GPT-2's pattern does:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with \p{L}, \p{N} the Unicode general categories L* and N*, and \s the White_Space property
// (as tiktoken and Python's regex module read it; JavaScript's \s differs on U+0085 and U+FEFF).
std::vector<std::string_view> pretokenize(std::string_view text);

// Reads DIR/gpt2.tiktoken, or when it is absent DIR/encoder.json and DIR/vocab.bpe.
std::unique_ptr<Tokenizer> load(const std::string& dir);

}  // namespace lockstep::data::gpt2
