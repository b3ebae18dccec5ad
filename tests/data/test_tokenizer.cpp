// Tokenizers: bytes and GPT-2's byte-level BPE. The GPT-2 encodings below are what the reference
// implementations give: tiktoken's and GPT-3-Encoder's published tests ("hello world", the
// repeated zeros, the emoji, "<|endoftext|>"), and the rest computed with the gpt-3-encoder npm
// package's JavaScript encoder on the same strings (tiktoken gives the same ids for every one).
// tests/scripts/gpt2_reference.sh compares with tiktoken itself on tens of MB. Tests that need
// the vocabulary skip, naming the command that fetches it, without it.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "data/gpt2_tokenizer.hpp"
#include "data_test_util.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/core/utf8.hpp"
#include "lockstep/data/tokenizer.hpp"

using namespace lockstep;
using namespace lockstep::data;
using lockstep::data::testing::TempDir;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define SKIP_WITHOUT_GPT2_FILES()                                                    \
  if (!gpt2_files_present())                                                         \
  GTEST_SKIP() << "GPT-2 vocabulary not found in " << default_gpt2_dir() << ": run " \
               << kGpt2FetchCommand << " (or set LOCKSTEP_GPT2_DIR)"

const Tokenizer& gpt2_tokenizer() {
  static std::unique_ptr<Tokenizer> t = make_tokenizer("gpt2");
  return *t;
}

struct Known {
  std::string text;
  std::vector<std::int32_t> ids;
};

const std::vector<Known>& known_gpt2_encodings() {
  static const std::vector<Known> cases = {
#include "gpt2_known_encodings.inc"
  };
  return cases;
}

// GPT-2's vocabulary as openai/gpt-2 spells it (encoder.json + vocab.bpe), written from the
// tokenizer at hand (whichever file it read): the old spelling's loader is tested without the
// old files. A merge is the first cut of each token into two tokens; the loader checks only that
// merge k makes token 256 + k.
void write_encoder_json_and_merges(const Tokenizer& t, const std::filesystem::path& dir) {
  std::array<char32_t, 256> byte_char{};
  for (int b = 0, shifted = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    byte_char[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : 256 + shifted++;
  }
  std::vector<std::string> bytes(50256);
  std::map<std::string, std::int32_t> id_of;
  for (std::int32_t id = 0; id < 50256; ++id) {
    const std::vector<std::int32_t> one{id};
    bytes[static_cast<std::size_t>(id)] = t.decode(one);
    id_of[bytes[static_cast<std::size_t>(id)]] = id;
  }
  auto spell = [&](const std::string& b) {
    std::string out;
    for (unsigned char c : b)
      utf8::append(out, byte_char[c]);
    return out;
  };
  std::ofstream json(dir / "encoder.json");
  json << "{";
  for (std::int32_t id = 0; id < 50256; ++id) {
    std::string key;
    for (char c : spell(bytes[static_cast<std::size_t>(id)]))
      key += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    json << "\"" << key << "\": " << id << ", ";
  }
  json << "\"<|endoftext|>\": 50256}";
  std::ofstream merges(dir / "vocab.bpe");
  merges << "#version: 0.2\n";
  for (std::int32_t id = 256; id < 50256; ++id) {
    const std::string& b = bytes[static_cast<std::size_t>(id)];
    for (std::size_t cut = 1; cut < b.size(); ++cut)
      if (id_of.count(b.substr(0, cut)) && id_of.count(b.substr(cut))) {
        merges << spell(b.substr(0, cut)) << " " << spell(b.substr(cut)) << "\n";
        break;
      }
  }
}

}  // namespace

// ---- UTF-8 checking
TEST(Utf8, WellFormedTextPasses) {
  EXPECT_NO_THROW(check_utf8("", "t"));
  EXPECT_NO_THROW(check_utf8("plain ASCII\n", "t"));
  EXPECT_NO_THROW(check_utf8("caf\u00E9 \u65E5\u672C \U0001F30D \U0010FFFF", "t"));
}

TEST(Utf8, IllFormedSequencesAreRefusedNamingOffsetLineAndColumn) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"ab\ncd\x80", "byte 0x80 at byte offset 5 (line 2, column 3)"},  // stray continuation
      {"x\xC3", "byte 0xc3 at byte offset 1 (line 1, column 2)"},       // truncated
      {"\xC0\x80", "byte 0xc0 at byte offset 0"},                       // overlong NUL
      {"\xE0\x80\xAF", "byte 0xe0 at byte offset 0"},                   // overlong '/'
      {"\xED\xA0\x80", "byte 0xed at byte offset 0"},                   // a surrogate
      {"\xF4\x90\x80\x80", "byte 0xf4 at byte offset 0"},               // above U+10FFFF
      {"caf\xE9", "byte 0xe9 at byte offset 3"},                        // Latin-1
  };
  for (const auto& [text, expected] : bad) {
    const std::string msg = error_of([&] { check_utf8(text, "corpus.txt"); });
    EXPECT_NE(msg.find("corpus.txt is not UTF-8"), std::string::npos) << msg;
    EXPECT_NE(msg.find(expected), std::string::npos) << msg;
  }
}

TEST(Utf8, DecodeAndAppendRoundTripEveryScalarValue) {
  for (char32_t cp = 0; cp <= 0x10FFFF; cp += (cp < 0x30000 ? 1 : 97)) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    utf8::append(s, cp);
    char32_t back = 0;
    ASSERT_EQ(utf8::decode(s, 0, back), static_cast<int>(s.size()))
        << static_cast<std::uint32_t>(cp);
    ASSERT_EQ(static_cast<std::uint32_t>(back), static_cast<std::uint32_t>(cp));
  }
}

// ---- bytes
TEST(BytesTokenizer, EveryByteIsItsOwnTokenAndDecodingRestoresTheText) {
  auto t = make_tokenizer("bytes");
  EXPECT_EQ(t->name(), "bytes");
  EXPECT_EQ(t->vocab_size(), 256);
  EXPECT_EQ(t->eot_token(), 0);
  const std::string text = "Hi \u00E9\n\U0001F30D";
  const auto ids = t->encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (std::size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(ids[i], static_cast<unsigned char>(text[i]));
  EXPECT_EQ((std::vector<std::int32_t>(ids.begin(), ids.begin() + 4)),
            (std::vector<std::int32_t>{'H', 'i', ' ', 0xC3}));
  EXPECT_EQ(t->decode(ids), text);
}

TEST(BytesTokenizer, RefusesNulBecauseItIsTheEndOfTextToken) {
  auto t = make_tokenizer("bytes");
  const std::string msg = error_of([&] { t->encode(std::string("ab\0c", 4)); });
  EXPECT_NE(msg.find("NUL byte at offset 2"), std::string::npos) << msg;
}

TEST(BytesTokenizer, RefusesTextThatIsNotUtf8AndIdsOutsideTheVocabulary) {
  auto t = make_tokenizer("bytes");
  EXPECT_NE(error_of([&] { t->encode("a\xFF"); }).find("byte offset 1"), std::string::npos);
  std::vector<std::int32_t> bad{65, 256};
  EXPECT_NE(error_of([&] { t->decode(bad); }).find("256"), std::string::npos);
}

TEST(BytesTokenizer, EncodeWithSpecialTurnsTheLiteralMarkerIntoEot) {
  auto t = make_tokenizer("bytes");
  EXPECT_EQ(t->encode_with_special("a<|endoftext|>b"), (std::vector<std::int32_t>{'a', 0, 'b'}));
  EXPECT_EQ(t->encode("<|e").size(), 3u);  // plain encode leaves it as text
}

TEST(Tokenizer, UnknownNameIsAnErrorListingTheKnownOnes) {
  const std::string msg = error_of([] { make_tokenizer("sentencepiece"); });
  EXPECT_NE(msg.find("unknown tokenizer 'sentencepiece'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bytes, gpt2"), std::string::npos) << msg;
}

// ---- GPT-2 pre-tokenisation (needs no vocabulary)
namespace {
std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  for (auto p : gpt2::pretokenize(text))
    out.emplace_back(p);
  return out;
}
using Pieces = std::vector<std::string>;
}  // namespace

TEST(Gpt2Pretokenize, SplitsWordsWithTheirLeadingSpace) {
  EXPECT_EQ(pieces("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces("Hello, world!"), (Pieces{"Hello", ",", " world", "!"}));
  EXPECT_EQ(pieces(""), Pieces{});
}

TEST(Gpt2Pretokenize, ContractionsAreTheirOwnPiecesAndCaseSensitive) {
  EXPECT_EQ(pieces("I'm you're we'll she'd it's"),
            (Pieces{"I", "'m", " you", "'re", " we", "'ll", " she", "'d", " it", "'s"}));
  EXPECT_EQ(pieces("I'M"), (Pieces{"I", "'", "M"}));  // no upper-case contractions in GPT-2
  EXPECT_EQ(pieces("''s"), (Pieces{"''", "s"}));      // a punctuation run takes the apostrophe
}

TEST(Gpt2Pretokenize, WhitespaceRunsLeaveTheirLastSpaceToTheNextWord) {
  EXPECT_EQ(pieces("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(pieces("a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces("a \n b"), (Pieces{"a", " \n", " b"}));
  EXPECT_EQ(pieces("end   "), (Pieces{"end", "   "}));  // at the end, the whole run
  EXPECT_EQ(pieces("  \t  z"), (Pieces{"  \t ", " z"}));
}

TEST(Gpt2Pretokenize, LettersAndNumbersFollowUnicodeCategories) {
  EXPECT_EQ(pieces("na\u00EFve r\u00E9sum\u00E9"), (Pieces{"na\u00EFve", " r\u00E9sum\u00E9"}));
  EXPECT_EQ(pieces("e=mc\u00B2"), (Pieces{"e", "=", "mc", "\u00B2"}));  // superscript two: No
  EXPECT_EQ(pieces("\u0661\u0662\u0663 x"), (Pieces{"\u0661\u0662\u0663", " x"}));  // Nd
  EXPECT_EQ(pieces("\u216B roman"), (Pieces{"\u216B", " roman"}));    // Roman numeral twelve: Nl
  EXPECT_EQ(pieces("\u01C5 \u02B0"), (Pieces{"\u01C5", " \u02B0"}));  // Lt and Lm are letters
  EXPECT_EQ(pieces("abc123def"), (Pieces{"abc", "123", "def"}));
  // A combining accent (Mn) is neither letter nor number: it splits the word.
  EXPECT_EQ(pieces("e\u0301t"), (Pieces{"e", "\u0301", "t"}));
}

TEST(Gpt2Pretokenize, WhitespaceIsTheUnicodeWhiteSpaceProperty) {
  EXPECT_EQ(pieces("\u00A0nbsp"), (Pieces{"\u00A0", "nbsp"}));
  EXPECT_EQ(pieces("a\u3000\u3000b"), (Pieces{"a", "\u3000", "\u3000", "b"}));
  EXPECT_EQ(pieces("a\u0085b"), (Pieces{"a", "\u0085", "b"}));  // NEL is White_Space
  // Zero-width space and BOM are format characters, not White_Space.
  EXPECT_EQ(pieces("zero\u200Bwidth"), (Pieces{"zero", "\u200B", "width"}));
  EXPECT_EQ(pieces("\uFEFFx"), (Pieces{"\uFEFF", "x"}));
}

TEST(Gpt2Pretokenize, PiecesCoverTheTextExactly) {
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {
      "a", "Z",      " ",      "  ",         "\n",     "\t",     "'",    "'s",    "1",
      "!", "\u00E9", "\u4E2D", "\U0001F30D", "\u00A0", "\u0301", "\r\n", "\u0663"};
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i)
      text += alphabet[rng() % alphabet.size()];
    std::string joined;
    for (auto p : gpt2::pretokenize(text)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, text);
  }
}

// ---- GPT-2 with its vocabulary
TEST(Gpt2Tokenizer, MatchesTheReferenceEncodings) {
  SKIP_WITHOUT_GPT2_FILES();
  const Tokenizer& t = gpt2_tokenizer();
  ASSERT_GE(known_gpt2_encodings().size(), 60u);
  for (const auto& k : known_gpt2_encodings()) {
    EXPECT_EQ(t.encode(k.text), k.ids) << "text: '" << k.text << "'";
    EXPECT_EQ(t.decode(k.ids), k.text);
  }
}

TEST(Gpt2Tokenizer, RepeatedZerosMatchTiktoken) {
  SKIP_WITHOUT_GPT2_FILES();
  const Tokenizer& t = gpt2_tokenizer();
  const std::vector<std::vector<std::int32_t>> expected = {
      {15},          {405},         {830},         {2388},      {20483},           {10535},
      {24598},       {8269},        {10535, 830},  {8269, 405}, {8269, 830},       {8269, 2388},
      {8269, 20483}, {8269, 10535}, {8269, 24598}, {25645},     {8269, 10535, 830}};
  for (std::size_t n = 1; n <= expected.size(); ++n)
    EXPECT_EQ(t.encode(std::string(n, '0')), expected[n - 1]) << n << " zeros";
}

TEST(Gpt2Tokenizer, EndOfTextIs50256AndOnlySpecialWhenAsked) {
  SKIP_WITHOUT_GPT2_FILES();
  const Tokenizer& t = gpt2_tokenizer();
  EXPECT_EQ(t.name(), "gpt2");
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.eot_token(), 50256);
  EXPECT_EQ(t.encode_with_special("hello <|endoftext|>"),
            (std::vector<std::int32_t>{31373, 220, 50256}));
  EXPECT_EQ(t.encode("hello <|endoftext|>"),
            (std::vector<std::int32_t>{31373, 1279, 91, 437, 1659, 5239, 91, 29}));
  const std::vector<std::int32_t> eot{50256};
  EXPECT_EQ(t.decode(eot), "<|endoftext|>");
}

TEST(Gpt2Tokenizer, DecodingInvertsEncodingOnRandomUnicodeText) {
  SKIP_WITHOUT_GPT2_FILES();
  const Tokenizer& t = gpt2_tokenizer();
  std::mt19937 rng(11);
  const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E},   {0x09, 0x0D},     {0xA0, 0x17F},    {0x370, 0x3FF},     {0x400, 0x4FF},
      {0x600, 0x6FF}, {0x3040, 0x30FF}, {0x4E00, 0x4FFF}, {0x1F300, 0x1F64F}, {0x2000, 0x206F}};
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int len = static_cast<int>(rng() % 60);
    for (int i = 0; i < len; ++i) {
      const auto& [lo, hi] = ranges[rng() % ranges.size()];
      utf8::append(text, lo + static_cast<char32_t>(rng() % (hi - lo + 1)));
    }
    const auto ids = t.encode(text);
    for (auto id : ids)
      ASSERT_TRUE(id >= 0 && id < 50256) << id;
    ASSERT_EQ(t.decode(ids), text);
  }
}

TEST(Gpt2Tokenizer, LongRepetitiveTextRoundTrips) {
  SKIP_WITHOUT_GPT2_FILES();
  const Tokenizer& t = gpt2_tokenizer();
  for (const std::string c : {"^", "0", "a", "'s", " ", "\n"}) {
    std::string big;
    for (int i = 0; i < 10000; ++i)
      big += c;
    for (const std::string& text : {big, " " + big, " " + big + "\n"})
      ASSERT_EQ(t.decode(t.encode(text)), text) << "'" << c << "' repeated";
  }
}

TEST(Gpt2Tokenizer, RefusesTextThatIsNotUtf8) {
  SKIP_WITHOUT_GPT2_FILES();
  const std::string msg = error_of([] { gpt2_tokenizer().encode("ok \xC3("); });
  EXPECT_NE(msg.find("byte offset 3"), std::string::npos) << msg;
}

TEST(Gpt2Tokenizer, MissingVocabularyNamesTheFilesAndTheFetchCommand) {
  TempDir dir;
  const std::string msg = error_of([&] { make_tokenizer("gpt2", dir.path()); });
  EXPECT_NE(msg.find(dir / "gpt2.tiktoken"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir / "encoder.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir / "vocab.bpe"), std::string::npos) << msg;
  EXPECT_NE(msg.find("scripts/install-deps.sh --gpt2"), std::string::npos) << msg;
  EXPECT_FALSE(gpt2_files_present(dir.path()));
}

TEST(Gpt2Tokenizer, DamagedVocabularyFilesAreErrorsNamingTheFile) {
  TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
  };
  write("vocab.bpe", "#version: 0.2\n");
  write("encoder.json", "{\"a\": 0, \"b\" 1}");
  std::string msg = error_of([&] { make_tokenizer("gpt2", dir.path()); });
  EXPECT_NE(msg.find(dir / "encoder.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected ':'"), std::string::npos) << msg;

  write("encoder.json", "{\"a\": 0}");
  msg = error_of([&] { make_tokenizer("gpt2", dir.path()); });
  EXPECT_NE(msg.find("has 1 tokens, GPT-2 has 50257"), std::string::npos) << msg;
}

TEST(Gpt2Tokenizer, ABadMergeLineIsAnErrorNamingTheLine) {
  SKIP_WITHOUT_GPT2_FILES();
  TempDir made, dir;
  write_encoder_json_and_merges(gpt2_tokenizer(), made.path());
  std::filesystem::copy_file(made / "encoder.json", dir / "encoder.json");
  std::ifstream in(made / "vocab.bpe");
  std::ofstream out(dir / "vocab.bpe");
  std::string line;
  for (int i = 0; std::getline(in, line); ++i)
    out << (i == 3 ? std::string("\xC4\xA0 zzzzqqq") : line) << "\n";  // "Ġ zzzzqqq"
  out.close();
  const std::string msg = error_of([&] { make_tokenizer("gpt2", dir.path()); });
  EXPECT_NE(msg.find(dir / "vocab.bpe"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 4"), std::string::npos) << msg;
}

TEST(Gpt2Tokenizer, AVocabularyFileThatParsesButIsNotGpt2sIsAnErrorNamingTheFile) {
  SKIP_WITHOUT_GPT2_FILES();
  const std::filesystem::path ranks = std::filesystem::path(default_gpt2_dir()) / kGpt2RankFile;
  if (!std::filesystem::exists(ranks)) GTEST_SKIP() << "no " << ranks;
  TempDir dir;
  std::ifstream in(ranks);
  std::ofstream out(dir / kGpt2RankFile);
  std::string line, held;
  for (int i = 0; std::getline(in, line); ++i) {
    // Ranks 1000 and 1001 swap their tokens: every line still parses, every rank is given once.
    const std::string b64 = line.substr(0, line.find(' '));
    if (i == 1000) {
      held = b64;
      continue;
    }
    if (i == 1001) {
      out << b64 << " 1000\n" << held << " 1001\n";
      continue;
    }
    out << line << "\n";
  }
  out.close();
  const std::string msg = error_of([&] { make_tokenizer("gpt2", dir.path()); });
  EXPECT_NE(msg.find(dir / kGpt2RankFile), std::string::npos) << msg;
  EXPECT_NE(msg.find("is not GPT-2's: the hash"), std::string::npos) << msg;
}

// Long texts are encoded in segments (about 64 KiB, cut after a "\n" between ASCII letters or
// digits, bounding the pre-tokeniser's memory): the ids must be those of the pieces of the whole.
TEST(Gpt2Tokenizer, ALongTextEncodesAsThePiecesOfTheWhole) {
  SKIP_WITHOUT_GPT2_FILES();
  const Tokenizer& t = gpt2_tokenizer();
  std::string text;
  for (int i = 0; text.size() < (std::size_t{300} << 10); ++i) {
    text += "Line " + std::to_string(i) + " says caf\u00E9 'tis";
    text += i % 3 == 0 ? "  \n" : i % 3 == 1 ? "\n\n " : "\nx";
  }
  std::vector<std::int32_t> pieces;
  for (std::string_view piece : gpt2::pretokenize(text))
    t.encode(piece, pieces);
  EXPECT_EQ(t.encode(text), pieces);
}

TEST(Gpt2Tokenizer, ThreadsEncodingAtOnceGetWhatOneThreadGets) {
  SKIP_WITHOUT_GPT2_FILES();
  const Tokenizer& t = gpt2_tokenizer();
  std::vector<std::string> texts;
  for (int k = 0; k < 4; ++k) {
    std::string text;
    for (int i = 0; i < 3000; ++i)
      text += "word" + std::to_string((i * 7 + k) % 997) + (i % 13 ? " " : ".\n");
    texts.push_back(text);
  }
  std::vector<std::vector<std::int32_t>> serial, parallel(texts.size());
  for (const auto& text : texts)
    serial.push_back(t.encode(text));
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < texts.size(); ++k)
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 3; ++rep)
        parallel[k] = t.encode(texts[k]);
    });
  for (auto& th : threads)
    th.join();
  EXPECT_EQ(parallel, serial);
}

// tiktoken's ranks are encoder.json's ids, and merge k of vocab.bpe makes token 256 + k: a file
// whose merges are out of that order would encode differently, so it is refused.
TEST(Gpt2Tokenizer, MergesOutOfRankOrderAreAnErrorNamingTheLine) {
  SKIP_WITHOUT_GPT2_FILES();
  TempDir made, dir;
  write_encoder_json_and_merges(gpt2_tokenizer(), made.path());
  std::filesystem::copy_file(made / "encoder.json", dir / "encoder.json");
  std::ifstream in(made / "vocab.bpe");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  std::swap(lines[10], lines[11]);  // merges 9 and 10
  std::ofstream out(dir / "vocab.bpe");
  for (const auto& line : lines)
    out << line << "\n";
  out.close();
  const std::string msg = error_of([&] { make_tokenizer("gpt2", dir.path()); });
  EXPECT_NE(msg.find(dir / "vocab.bpe"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 11 makes token 266, but merge 9 must make token 265"), std::string::npos)
      << msg;
}

// The rank file and openai/gpt-2's two files are two spellings of one vocabulary: either makes the
// same tokenizer, and the rank file is read first when a folder holds both.
TEST(Gpt2Tokenizer, EncoderJsonAndTheRankFileEncodeAlike) {
  SKIP_WITHOUT_GPT2_FILES();
  TempDir dir;
  write_encoder_json_and_merges(gpt2_tokenizer(), dir.path());
  ASSERT_TRUE(gpt2_files_present(dir.path()));
  const auto old_files = make_tokenizer("gpt2", dir.path());
  for (const auto& k : known_gpt2_encodings())
    EXPECT_EQ(old_files->encode(k.text), k.ids) << "text: '" << k.text << "'";
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    for (int i = 0, n = static_cast<int>(rng() % 80); i < n; ++i)
      utf8::append(text, rng() % 4 ? 0x20 + rng() % 0x5F : 0xA0 + rng() % 0x3000);
    ASSERT_EQ(old_files->encode(text), gpt2_tokenizer().encode(text)) << text;
  }
}

TEST(Gpt2Tokenizer, DamagedRankFileIsAnErrorNamingTheFileAndLine) {
  TempDir dir;
  auto write = [&](const std::string& text) { std::ofstream(dir / "gpt2.tiktoken") << text; };
  auto message = [&] { return error_of([&] { make_tokenizer("gpt2", dir.path()); }); };
  ASSERT_TRUE((write("IQ== 0\n"), gpt2_files_present(dir.path())));
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {"IQ== 0\nIg==1\n", "line 2 is not 'base64 rank'"},
           {"IQ== 0\nI*== 1\n", "line 2 is not 'base64 rank'"},
           {"IQ== 0\nIg= 1\n", "line 2 is not 'base64 rank'"},
           {"IQ== 0\nIg== 0\n", "line 2 gives rank 0, outside [0, 50256) or given twice"},
           {"IQ== 0\nIg== 50256\n", "line 2 gives rank 50256"},
           {"IQ== 0\nIg== 1\n", "has 2 ranks, GPT-2 has 50256"}}) {
    write(text);
    const std::string msg = message();
    EXPECT_NE(msg.find(dir / "gpt2.tiktoken"), std::string::npos) << msg;
    EXPECT_NE(msg.find(expected), std::string::npos) << msg;
  }
}

// Text that is not UTF-8 is refused (Utf8 tests above); a character GPT-2 has no token for falls
// back to the tokens of its bytes, each of the 256 bytes having one.
TEST(Gpt2Tokenizer, EveryByteHasATokenAndUnseenCharactersFallBackToBytes) {
  SKIP_WITHOUT_GPT2_FILES();
  const Tokenizer& t = gpt2_tokenizer();
  std::set<std::string> one_byte;
  for (std::int32_t id = 0; id < 256; ++id) {
    const std::vector<std::int32_t> one{id};
    one_byte.insert(t.decode(one));
  }
  EXPECT_EQ(one_byte.size(), 256u);
  for (const std::string& s : one_byte)
    EXPECT_EQ(s.size(), 1u);
  // U+10FFF0 (plane 16 private use): four bytes, no two of which make a token.
  const std::string rare = "\U0010FFF0";
  const auto ids = t.encode(rare);
  ASSERT_EQ(ids.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    const std::vector<std::int32_t> one{ids[i]};
    EXPECT_EQ(t.decode(one), rare.substr(i, 1));
  }
}
