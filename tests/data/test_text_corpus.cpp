// Text corpora: files are cut into documents, every document is preceded by end-of-text, the
// validation split takes evenly spaced documents, and bad input is an error naming the file.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include "data_test_util.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/data/text_corpus.hpp"

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
bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir / name, std::ios::binary) << text;
  return dir / name;
}
// The bytes stream of documents, each preceded by end-of-text (0).
std::vector<std::int32_t> stream(const std::vector<std::string>& docs) {
  std::vector<std::int32_t> out;
  for (const auto& d : docs) {
    out.push_back(0);
    for (unsigned char c : d)
      out.push_back(c);
  }
  return out;
}
}  // namespace

TEST(TextCorpus, EachFileIsADocumentPrecededByEndOfText) {
  TempDir dir;
  auto a = write(dir, "a.txt", "Hello\nworld\n");
  auto b = write(dir, "b.txt", "caf\u00E9");
  auto empty = write(dir, "c.txt", "  \n");
  auto tok = make_tokenizer("bytes");
  auto s = tokenize_corpus({a, empty, b}, *tok, {});
  EXPECT_EQ(s.train, stream({"Hello\nworld\n", "caf\u00E9"}));
  EXPECT_TRUE(s.val.empty());
  EXPECT_EQ(s.train_documents, 2);
  EXPECT_EQ(s.text_bytes, 12 + 5);
}

TEST(TextCorpus, ParagraphsAndLinesAreCutAtBlankLinesAndNewlines) {
  TempDir dir;
  auto f = write(dir, "p.txt", "one\r\ntwo\n\n \t\nthree\n\n\nfour");
  auto tok = make_tokenizer("bytes");
  TextCorpusOptions o;
  o.documents = DocumentSplit::Paragraph;
  EXPECT_EQ(tokenize_corpus({f}, *tok, o).train, stream({"one\ntwo", "three", "four"}));
  o.documents = DocumentSplit::Line;
  EXPECT_EQ(tokenize_corpus({f}, *tok, o).train, stream({"one", "two", "three", "four"}));
  EXPECT_EQ(document_split_from_name("paragraph"), DocumentSplit::Paragraph);
  EXPECT_TRUE(contains(error_of([] { document_split_from_name("page"); }), "'page'"));
}

TEST(TextCorpus, ValidationTakesEvenlySpacedDocuments) {
  TempDir dir;
  std::string text;
  std::vector<std::string> train, val;
  for (int d = 0; d < 20; ++d) {
    const std::string line = "doc" + std::to_string(d);
    text += line + "\n";
    // floor((d+1)/4) > floor(d/4) exactly when d+1 is a multiple of 4.
    ((d + 1) % 4 == 0 ? val : train).push_back(line);
  }
  auto f = write(dir, "docs.txt", text);
  TextCorpusOptions o;
  o.documents = DocumentSplit::Line;
  o.val_fraction = 0.25;
  auto s = tokenize_corpus({f}, *make_tokenizer("bytes"), o);
  EXPECT_EQ(s.val_documents, 5);
  EXPECT_EQ(s.train_documents, 15);
  EXPECT_EQ(s.val, stream(val));
  EXPECT_EQ(s.train, stream(train));
}

TEST(TextCorpus, AFileThatIsNotUtf8IsAnErrorNamingFileOffsetAndLine) {
  TempDir dir;
  auto good = write(dir, "good.txt", "fine\n");
  auto bad = write(dir, "latin1.txt", "first line\nna\xEFve\n");
  const std::string msg = error_of([&] {
    tokenize_corpus({good, bad}, *make_tokenizer("bytes"), {});
  });
  EXPECT_TRUE(contains(msg, bad + " is not UTF-8")) << msg;
  EXPECT_TRUE(contains(msg, "byte offset 13 (line 2, column 3)")) << msg;
  EXPECT_TRUE(contains(msg, "iconv")) << msg;
}

TEST(TextCorpus, AnEmptyCorpusIsAnErrorNamingTheFiles) {
  TempDir dir;
  auto a = write(dir, "empty.txt", "");
  auto b = write(dir, "blank.txt", "\n  \n\t\n");
  for (auto mode : {DocumentSplit::File, DocumentSplit::Paragraph, DocumentSplit::Line}) {
    TextCorpusOptions o;
    o.documents = mode;
    const std::string msg = error_of([&] { tokenize_corpus({a, b}, *make_tokenizer("bytes"), o); });
    EXPECT_TRUE(contains(msg, "empty corpus: " + a + " and 1 more")) << msg;
  }
}

TEST(TextCorpus, AValidationFractionThatSelectsNothingOrEverythingIsAnError) {
  TempDir dir;
  auto f = write(dir, "one.txt", "a single document\n");
  TextCorpusOptions o;
  o.val_fraction = 0.1;
  std::string msg = error_of([&] { tokenize_corpus({f}, *make_tokenizer("bytes"), o); });
  EXPECT_TRUE(contains(msg, "selects no validation document")) << msg;
  EXPECT_TRUE(contains(msg, "--documents=paragraph")) << msg;
  o.val_fraction = 1.0;
  msg = error_of([&] { tokenize_corpus({f}, *make_tokenizer("bytes"), o); });
  EXPECT_TRUE(contains(msg, "outside [0, 1)")) << msg;
}

TEST(TextCorpus, TheBytesTokenizersNulRefusalNamesTheFileAndLine) {
  TempDir dir;
  auto f = write(dir, "nul.txt", std::string("ok\nbad\0line\n", 12));
  TextCorpusOptions o;
  o.documents = DocumentSplit::Line;
  const std::string msg = error_of([&] { tokenize_corpus({f}, *make_tokenizer("bytes"), o); });
  EXPECT_TRUE(contains(msg, f + ", document from line 2")) << msg;
  EXPECT_TRUE(contains(msg, "NUL byte")) << msg;
}

TEST(TextCorpus, InputsExpandGlobsInOrderAndNameWhatIsMissing) {
  TempDir dir;
  write(dir, "b.txt", "b");
  write(dir, "a.txt", "a");
  std::filesystem::create_directory(dir / "sub");
  EXPECT_EQ(expand_text_inputs({dir / "*.txt"}),
            (std::vector<std::string>{dir / "a.txt", dir / "b.txt"}));
  EXPECT_EQ(expand_text_inputs({dir / "b.txt", dir / "a.txt"}),
            (std::vector<std::string>{dir / "b.txt", dir / "a.txt"}));
  EXPECT_TRUE(contains(error_of([&] { expand_text_inputs({dir / "nope.txt"}); }),
                       dir / "nope.txt does not exist"));
  EXPECT_TRUE(contains(error_of([&] { expand_text_inputs({dir / "sub"}); }), "is a folder"));
  EXPECT_TRUE(contains(error_of([&] { expand_text_inputs({dir / "*.md"}); }), "no text file"));
  EXPECT_TRUE(contains(error_of([] { expand_text_inputs({}); }), "no text input"));
}
