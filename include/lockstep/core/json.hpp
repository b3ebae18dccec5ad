// The one JSON reader of the library, strict (RFC 8259), so that it needs no JSON dependency:
// GPT-2's encoder.json, JSON Lines records of a text corpus, and the Chrome traces lockstep-trace
// reads all go through it.
//
// json::Reader is a pull reader for text read once, in order: a caller that wants one field of a
// record takes it and skips the rest without building anything (the JSON Lines path reads
// gigabytes this way). json::parse builds a json::Value tree for text small enough to hold
// (a trace). Malformed text is a lockstep::Error that says where, what was expected, and at
// which position: "<where>: <problem>: <what> at byte N" (or "at column N" for one-line records).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep::json {

// Who reads the text, for the errors: "train.jsonl:3" / "not a JSON Lines record" / a hint.
// Views: what they name must outlive the reader.
struct Source {
  std::string_view where;
  std::string_view problem;
  std::string_view hint;
  bool columns = false;  // positions as 1-based columns (a one-line record), else 0-based bytes
};

class Reader {
 public:
  // Both text and source must outlive the reader.
  Reader(std::string_view text, const Source& source) : s_(text), source_(source) {}

  [[noreturn]] void fail(std::string_view what) const;

  // Skips whitespace; whether the next character is c (not consumed).
  bool at(char c);
  // Skips whitespace and takes c, else fails with `what`.
  void expect(char c, std::string_view what);
  // Skips whitespace and takes c when it is next.
  bool take(char c);
  // Skips whitespace and takes `word` (true, false, null) when it is next.
  bool take_word(std::string_view word);
  // Whether only whitespace is left.
  bool at_end();

  // A string; its unescaped UTF-8 into *out, or skipped when out is null. \u escapes, surrogate
  // pairs included, become UTF-8; control characters and lone surrogates are errors.
  void string(std::string* out);
  // An integer without fraction or exponent, at most 18 digits.
  std::int64_t integer();
  // Any number (strtod's reading of JSON's number grammar).
  double number();
  // Any value, skipped; nesting is bounded so a hostile text cannot overflow the stack.
  void skip_value(int depth = 0);

  std::size_t position() const { return i_; }

 private:
  void ws();
  char32_t hex4();

  std::string_view s_;
  const Source& source_;
  std::size_t i_ = 0;
};

struct Value {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  double number = 0;  // Number; Bool as 0 or 1
  std::string text;   // String
  std::vector<Value> items;
  std::vector<std::pair<std::string, Value>> fields;  // in the order of the text

  const Value* get(std::string_view key) const;
  double num(std::string_view key, double fallback = 0) const;
  std::string str(std::string_view key) const;  // "" when missing or not a string
};

// The whole text as one value (whitespace around it allowed, nothing else).
Value parse(std::string_view text, const Source& source);

}  // namespace lockstep::json
