// The library's one JSON reader (core/json.hpp): escapes to UTF-8, skipping, the value tree,
// every kind of malformed text refused with its position, and a round trip of generated
// documents through an independent writer.
#include "lockstep/core/json.hpp"

#include <gtest/gtest.h>

#include <random>

#include "lockstep/core/error.hpp"

namespace lockstep::json {
namespace {

const Source kSource{"doc.json", "not a test document", "a hint"};
const Source kLine{"data.jsonl:3", "not a JSON Lines record", "a hint", true};

std::string read_string(std::string_view text) {
  Reader r(text, kSource);
  std::string out;
  r.string(&out);
  EXPECT_TRUE(r.at_end());
  return out;
}

std::string error_of(std::string_view text, const Source& source = kSource) {
  try {
    parse(text, source);
  } catch (const Error& e) {
    EXPECT_EQ(e.hint(), std::string(source.hint));
    return e.message();
  }
  return "";
}

TEST(Json, StringEscapesBecomeUtf8) {
  EXPECT_EQ(read_string(R"("a\"b\\c\/d")"), "a\"b\\c/d");
  EXPECT_EQ(read_string(R"("\b\f\n\r\t")"), "\b\f\n\r\t");
  EXPECT_EQ(read_string(R"("\u0041\u00e9\u20AC")"), "A\xC3\xA9\xE2\x82\xAC");  // A, e-acute, euro
  EXPECT_EQ(read_string(R"("\ud83d\ude00")"), "\xF0\x9F\x98\x80");  // U+1F600, a surrogate pair
  EXPECT_EQ(read_string("\"raw \xC3\xA9 bytes\""), "raw \xC3\xA9 bytes");  // UTF-8 passes as is
  EXPECT_EQ(read_string(R"("")"), "");
}

TEST(Json, IntegersAndNumbers) {
  Reader r("[12, -7, 0, 123456789012345678]", kSource);
  r.expect('[', "");
  EXPECT_EQ(r.integer(), 12);
  r.expect(',', "");
  EXPECT_EQ(r.integer(), -7);
  r.expect(',', "");
  EXPECT_EQ(r.integer(), 0);
  r.expect(',', "");
  EXPECT_EQ(r.integer(), 123456789012345678);
  r.expect(']', "");
  const Value v = parse("[1.5, -2e3, 0.25E-2, 7]", kSource);
  ASSERT_EQ(v.items.size(), 4u);
  EXPECT_EQ(v.items[0].number, 1.5);
  EXPECT_EQ(v.items[1].number, -2000.0);
  EXPECT_EQ(v.items[2].number, 0.0025);
  EXPECT_EQ(v.items[3].number, 7.0);
}

TEST(Json, SkipValueSkipsNestedValuesWhole) {
  Reader r(R"({"a": [1, {"b": [true, false, null, "x\"}"]}], "c": "keep"})", kSource);
  r.expect('{', "");
  std::string key, value;
  r.string(&key);
  EXPECT_EQ(key, "a");
  r.expect(':', "");
  r.skip_value();
  r.expect(',', "");
  r.string(&key);
  r.expect(':', "");
  r.string(&value);
  EXPECT_EQ(key, "c");
  EXPECT_EQ(value, "keep");
  r.expect('}', "");
  EXPECT_TRUE(r.at_end());
}

TEST(Json, ValueTree) {
  const Value v = parse(R"( {"name": "step", "ts": 12.5, "args": {"step": 3}, "on": true,
                             "off": false, "none": null, "list": []} )",
                        kSource);
  ASSERT_EQ(v.kind, Value::Object);
  EXPECT_EQ(v.str("name"), "step");
  EXPECT_EQ(v.num("ts"), 12.5);
  EXPECT_EQ(v.get("args")->num("step"), 3.0);
  EXPECT_EQ(v.get("on")->kind, Value::Bool);
  EXPECT_EQ(v.get("on")->number, 1.0);
  EXPECT_EQ(v.get("off")->number, 0.0);
  EXPECT_EQ(v.get("none")->kind, Value::Null);
  EXPECT_EQ(v.get("list")->kind, Value::Array);
  EXPECT_TRUE(v.get("list")->items.empty());
  EXPECT_EQ(v.get("missing"), nullptr);
  EXPECT_EQ(v.str("ts"), "");  // not a string
  EXPECT_EQ(v.num("name", -1), -1);
}

TEST(Json, MalformedTextNamesWhatAndWhere) {
  EXPECT_EQ(error_of(R"({"a" 1})"), "doc.json: not a test document: expected ':' at byte 5");
  EXPECT_EQ(error_of(R"({"a": 1)"), "doc.json: not a test document: expected ',' or '}' at byte 7");
  EXPECT_EQ(error_of(R"(["a)"), "doc.json: not a test document: unterminated string at byte 3");
  EXPECT_EQ(error_of(R"(["\q"])"), "doc.json: not a test document: an unknown escape at byte 3");
  EXPECT_EQ(error_of(R"(["\ud83d"])"),
            "doc.json: not a test document: a lone surrogate \\u escape at byte 8");
  EXPECT_EQ(error_of(R"(["\ude00"])"),
            "doc.json: not a test document: a lone surrogate \\u escape at byte 8");
  EXPECT_EQ(error_of(R"(["\u12G4"])"), "doc.json: not a test document: a bad \\u escape at byte 7");
  EXPECT_EQ(error_of("[\"a\nb\"]"),
            "doc.json: not a test document: a control character in a string at byte 3");
  EXPECT_EQ(error_of("[1] 2"),
            "doc.json: not a test document: text after the JSON value at byte 4");
  EXPECT_EQ(error_of("[tru]"), "doc.json: not a test document: expected a value at byte 1");
  EXPECT_EQ(error_of(""), "doc.json: not a test document: expected a value at byte 0");
  EXPECT_EQ(error_of(std::string(300, '[')),
            "doc.json: not a test document: nesting deeper than 256 at byte 257");
  // One-line records count columns from 1.
  EXPECT_EQ(error_of(R"({"text": "x)", kLine),
            "data.jsonl:3: not a JSON Lines record: unterminated string at column 12");
  Reader r("1.5", kSource);
  EXPECT_THROW(r.integer(), Error);
  Reader big("1234567890123456789", kSource);
  EXPECT_THROW(big.integer(), Error);
}

// An independent writer: random documents, written as JSON, must read back to the same tree.
struct Gen {
  std::mt19937 rng{7};
  std::string text(Value& v, int depth) {
    const int kind = depth > 3 ? static_cast<int>(rng() % 3) : static_cast<int>(rng() % 5);
    if (kind == 0) {
      v.kind = Value::Number;
      v.number = static_cast<double>(static_cast<int>(rng() % 2001) - 1000) / 8;
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", v.number);
      return buf;
    }
    if (kind == 1) {
      v.kind = Value::Bool;
      v.number = rng() % 2;
      return v.number ? "true" : "false";
    }
    if (kind == 2) {
      v.kind = Value::String;
      std::string out = "\"";
      for (int i = 0, n = static_cast<int>(rng() % 8); i < n; ++i) {
        const char32_t pick[] = {U'a', U'"', U'\\', U'\n', U'\u00e9', U'\U0001F600', U' '};
        const char32_t cp = pick[rng() % 7];
        char esc[16];
        std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(cp & 0xFFFF));
        if (cp == U'"' || cp == U'\\') {
          out += '\\';
          out += static_cast<char>(cp);
          v.text += static_cast<char>(cp);
        } else if (cp == U'\n') {
          out += "\\n";
          v.text += '\n';
        } else if (cp == U'\u00e9') {
          out += esc;
          v.text += "\xC3\xA9";
        } else if (cp == U'\U0001F600') {
          out += "\\uD83D\\uDE00";
          v.text += "\xF0\x9F\x98\x80";
        } else {
          out += static_cast<char>(cp);
          v.text += static_cast<char>(cp);
        }
      }
      return out + "\"";
    }
    const bool object = kind == 3;
    v.kind = object ? Value::Object : Value::Array;
    std::string out = object ? "{" : "[";
    for (int i = 0, n = static_cast<int>(rng() % 4); i < n; ++i) {
      if (i) out += rng() % 2 ? "," : " ,\n ";
      Value item;
      if (object) {
        const std::string key = "k" + std::to_string(i);
        out += "\"" + key + "\":";
        out += text(item, depth + 1);
        v.fields.emplace_back(key, std::move(item));
      } else {
        out += text(item, depth + 1);
        v.items.push_back(std::move(item));
      }
    }
    return out + (object ? "}" : "]");
  }
};

void expect_same(const Value& a, const Value& b) {
  ASSERT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.number, b.number);
  EXPECT_EQ(a.text, b.text);
  ASSERT_EQ(a.items.size(), b.items.size());
  for (std::size_t i = 0; i < a.items.size(); ++i)
    expect_same(a.items[i], b.items[i]);
  ASSERT_EQ(a.fields.size(), b.fields.size());
  for (std::size_t i = 0; i < a.fields.size(); ++i) {
    EXPECT_EQ(a.fields[i].first, b.fields[i].first);
    expect_same(a.fields[i].second, b.fields[i].second);
  }
}

TEST(Json, GeneratedDocumentsReadBack) {
  Gen gen;
  for (int doc = 0; doc < 500; ++doc) {
    Value expected;
    const std::string text = gen.text(expected, 0);
    SCOPED_TRACE(text);
    expect_same(parse(text, kSource), expected);
    Reader r(text, kSource);  // skipping reads exactly the same extent
    r.skip_value();
    EXPECT_TRUE(r.at_end());
  }
}

}  // namespace
}  // namespace lockstep::json
