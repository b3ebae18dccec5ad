#include "lockstep/core/json.hpp"

#include <cstdlib>
#include <cstring>

#include "lockstep/core/error.hpp"
#include "lockstep/core/utf8.hpp"

namespace lockstep::json {
namespace {

constexpr int kMaxDepth = 256;

bool is_number_char(char c) {
  return c != '\0' && std::strchr("+-0123456789.eE", c) != nullptr;
}

Value parse_value(Reader& r, int depth) {
  if (depth > kMaxDepth) r.fail("nesting deeper than 256");
  Value v;
  if (r.take('{')) {
    v.kind = Value::Object;
    if (r.take('}')) return v;
    do {
      std::string key;
      r.string(&key);
      r.expect(':', "expected ':'");
      v.fields.emplace_back(std::move(key), parse_value(r, depth + 1));
    } while (r.take(','));
    r.expect('}', "expected ',' or '}'");
  } else if (r.take('[')) {
    v.kind = Value::Array;
    if (r.take(']')) return v;
    do
      v.items.push_back(parse_value(r, depth + 1));
    while (r.take(','));
    r.expect(']', "expected ',' or ']'");
  } else if (r.at('"')) {
    v.kind = Value::String;
    r.string(&v.text);
  } else if (r.take_word("true")) {
    v.kind = Value::Bool;
    v.number = 1;
  } else if (r.take_word("false")) {
    v.kind = Value::Bool;
  } else if (r.take_word("null")) {
    v.kind = Value::Null;
  } else {
    v.kind = Value::Number;
    v.number = r.number();
  }
  return v;
}

}  // namespace

void Reader::fail(std::string_view what) const {
  const std::string hint(source_.hint);
  if (source_.columns) {
    LOCKSTEP_FAIL_HINT(hint, source_.where, ": ", source_.problem, ": ", what, " at column ",
                       i_ + 1);
  }
  LOCKSTEP_FAIL_HINT(hint, source_.where, ": ", source_.problem, ": ", what, " at byte ", i_);
}

void Reader::ws() {
  while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n'))
    ++i_;
}

bool Reader::at(char c) {
  ws();
  return i_ < s_.size() && s_[i_] == c;
}

void Reader::expect(char c, std::string_view what) {
  if (!at(c)) fail(what);
  ++i_;
}

bool Reader::take(char c) {
  if (!at(c)) return false;
  ++i_;
  return true;
}

bool Reader::take_word(std::string_view word) {
  ws();
  if (s_.substr(i_, word.size()) != word) return false;
  i_ += word.size();
  return true;
}

bool Reader::at_end() {
  ws();
  return i_ == s_.size();
}

char32_t Reader::hex4() {
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

void Reader::string(std::string* out) {
  expect('"', "expected a string");
  if (out) out->clear();
  for (;;) {
    // The plain run up to the next quote, backslash or control character, appended at once.
    const std::size_t start = i_;
    while (i_ < s_.size() && s_[i_] != '"' && s_[i_] != '\\' &&
           static_cast<unsigned char>(s_[i_]) >= 0x20)
      ++i_;
    if (out) out->append(s_.data() + start, i_ - start);
    if (i_ >= s_.size()) fail("unterminated string");
    const char c = s_[i_++];
    if (c == '"') return;
    if (c != '\\') {
      --i_;
      fail("a control character in a string");
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
        --i_;
        fail("an unknown escape");
    }
    if (out) *out += plain;
  }
}

std::int64_t Reader::integer() {
  ws();
  const bool negative = i_ < s_.size() && s_[i_] == '-';
  if (negative) ++i_;
  const std::size_t digits_at = i_;
  std::int64_t v = 0;
  while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
    if (i_ - digits_at == 18) fail("an integer of more than 18 digits");
    v = v * 10 + (s_[i_++] - '0');
  }
  if (i_ == digits_at) fail("expected an integer");
  if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E'))
    fail("expected an integer, not a fraction");
  return negative ? -v : v;
}

double Reader::number() {
  ws();
  const std::size_t start = i_;
  while (i_ < s_.size() && is_number_char(s_[i_]))
    ++i_;
  const std::string digits(s_.substr(start, i_ - start));
  char* end = nullptr;
  const double v = std::strtod(digits.c_str(), &end);
  if (digits.empty() || end != digits.c_str() + digits.size()) {
    i_ = start;
    fail("expected a value");
  }
  return v;
}

void Reader::skip_value(int depth) {
  if (depth > kMaxDepth) fail("nesting deeper than 256");
  ws();
  if (i_ >= s_.size()) fail("expected a value");
  const char c = s_[i_];
  if (c == '"') return string(nullptr);
  if (c == '{' || c == '[') {
    const char close = c == '{' ? '}' : ']';
    ++i_;
    if (take(close)) return;
    for (;;) {
      if (close == '}') {
        string(nullptr);
        expect(':', "expected ':'");
      }
      skip_value(depth + 1);
      if (take(',')) continue;
      expect(close, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
      return;
    }
  }
  if (take_word("true") || take_word("false") || take_word("null")) return;
  number();
}

const Value* Value::get(std::string_view key) const {
  for (const auto& [k, v] : fields)
    if (k == key) return &v;
  return nullptr;
}

double Value::num(std::string_view key, double fallback) const {
  const Value* v = get(key);
  return v && v->kind == Number ? v->number : fallback;
}

std::string Value::str(std::string_view key) const {
  const Value* v = get(key);
  return v && v->kind == String ? v->text : "";
}

Value parse(std::string_view text, const Source& source) {
  Reader r(text, source);
  Value v = parse_value(r, 0);
  if (!r.at_end()) r.fail("text after the JSON value");
  return v;
}

}  // namespace lockstep::json
