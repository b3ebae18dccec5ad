// Text corpora: files are cut into documents, every document is preceded by end-of-text, the
// validation split takes evenly spaced documents, and bad input is an error naming the file. The
// stream is cut into chunks that threads and ranks encode; what comes out never depends on them.
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <barrier>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <thread>

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
  EXPECT_TRUE(contains(error_of([&] { expand_text_inputs({dir / "sub"}); }), "holds no file"));
  write(dir, "sub/z.txt", "z");
  write(dir, "sub/y.txt", "y");
  EXPECT_EQ(expand_text_inputs({dir / "sub", "-"}),
            (std::vector<std::string>{dir / "sub/y.txt", dir / "sub/z.txt", "-"}));
  EXPECT_TRUE(contains(error_of([&] { expand_text_inputs({dir / "*.md"}); }), "no text file"));
  EXPECT_TRUE(contains(error_of([] { expand_text_inputs({}); }), "no text input"));
}

namespace {
// The cut of the whole-file reader lockstep had before streaming, kept as the specification the
// streaming reader must match: lines end at "\n" (a "\r" before it dropped), blank lines end
// paragraphs, and documents without a visible character are skipped.
std::vector<std::string> whole_text_cut(const std::string& text, DocumentSplit mode) {
  auto blank = [](std::string_view s) { return s.find_first_not_of(" \t\r\n\v\f") == s.npos; };
  std::vector<std::string> docs;
  std::string paragraph;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    start = end + 1;
    if (blank(line)) {
      if (!paragraph.empty()) docs.push_back(paragraph);
      paragraph.clear();
    } else if (mode == DocumentSplit::Line) {
      docs.emplace_back(line);
    } else {
      if (!paragraph.empty()) paragraph += '\n';
      paragraph += line;
    }
  }
  if (!paragraph.empty()) docs.push_back(paragraph);
  return docs;
}

// About 3 MB of paragraphs of random words and lengths, some lines ending in "\r\n": several
// chunks, with documents and lines across the reader's block boundaries.
std::string random_text(std::size_t bytes, unsigned seed) {
  std::mt19937 rng(seed);
  const char* words[] = {"alpha", "beta", "gamma", "\u00E9t\u00E9", "delta", "\u4E2D\u6587", "x"};
  std::string text;
  while (text.size() < bytes) {
    const int lines = 1 + static_cast<int>(rng() % 6);
    for (int l = 0; l < lines; ++l) {
      const int n = 1 + static_cast<int>(rng() % 40);
      for (int w = 0; w < n; ++w)
        text += std::string(w ? " " : "") + words[rng() % 7];
      text += rng() % 5 == 0 ? "\r\n" : "\n";
    }
    text += rng() % 3 == 0 ? "\n  \n" : "\n";
  }
  return text;
}
}  // namespace

TEST(TextCorpus, StreamingCutsDocumentsAsTheWholeFileReaderDid) {
  TempDir dir;
  const std::string text = random_text(std::size_t{3} << 20, 1) + "last line without newline";
  auto f = write(dir, "big.txt", text);
  auto tok = make_tokenizer("bytes");
  for (auto mode : {DocumentSplit::Paragraph, DocumentSplit::Line}) {
    TextCorpusOptions o;
    o.documents = mode;
    const auto s = tokenize_corpus({f}, *tok, o);
    const auto docs = whole_text_cut(text, mode);
    EXPECT_EQ(s.train_documents, static_cast<std::int64_t>(docs.size()));
    EXPECT_TRUE(s.train == stream(docs)) << "documents differ in mode " << static_cast<int>(mode);
  }
}

TEST(TextCorpus, TokensAndSplitAreTheSameForAnyThreadsAndRanks) {
  TempDir dir;
  auto a = write(dir, "a.txt", random_text(std::size_t{2} << 20, 2));
  auto b = write(dir, "b.txt", random_text(std::size_t{1} << 20, 3));
  auto tok = make_tokenizer("bytes");
  TextCorpusOptions o;
  o.documents = DocumentSplit::Paragraph;
  o.val_fraction = 0.05;
  const auto one = tokenize_corpus({a, b}, *tok, o);
  ASSERT_GT(one.val_documents, 0);
  for (int threads : {2, 3}) {
    o.threads = threads;
    const auto many = tokenize_corpus({a, b}, *tok, o);
    EXPECT_TRUE(many.train == one.train && many.val == one.val) << threads << " threads";
  }
  // Ranks: chunk c is encoded by rank c mod R; put back in chunk order, the stream is the same.
  for (int ranks : {2, 3}) {
    std::map<std::int64_t, std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>>> chunks;
    for (int r = 0; r < ranks; ++r) {
      encode_corpus(
          {a, b}, *tok, o, r, ranks,
          [&](std::int64_t c, std::span<const std::int32_t> t, std::span<const std::int32_t> v) {
            EXPECT_EQ(c % ranks, r);
            chunks[c] = {{t.begin(), t.end()}, {v.begin(), v.end()}};
          });
    }
    std::vector<std::int32_t> train, val;
    for (const auto& [c, tv] : chunks) {
      train.insert(train.end(), tv.first.begin(), tv.first.end());
      val.insert(val.end(), tv.second.begin(), tv.second.end());
    }
    EXPECT_TRUE(train == one.train && val == one.val) << ranks << " ranks";
  }
}

TEST(TextCorpus, ShardsOfRanksSharingAFolderAreTheBytesOfOneProcess) {
  TempDir dir;
  auto a = write(dir, "a.txt", random_text(std::size_t{3} << 20, 4));
  auto tok = make_tokenizer("bytes");
  TextCorpusOptions o;
  o.documents = DocumentSplit::Line;
  o.val_fraction = 0.01;
  auto plan_for = [&](const std::string& out) {
    TextShardPlan p;
    p.out_dir = dir / out;
    p.shards = 3;
    p.meta.tokenizer = tok->name();
    p.meta.vocab_size = tok->vocab_size();
    p.meta.eot_token = tok->eot_token();
    return p;
  };
  const auto one = shard_corpus({a}, *tok, o, plan_for("one"), 0, 1, [] {});
  ASSERT_EQ(one.train_paths.size(), 3u);
  // Three "ranks" as threads of this process, meeting at a barrier as MPI ranks would.
  std::barrier meet(3);
  std::vector<std::thread> ranks;
  TextShardResult rank0;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      auto res =
          shard_corpus({a}, *tok, o, plan_for("three"), r, 3, [&] { meet.arrive_and_wait(); });
      if (r == 0) rank0 = res;
    });
  }
  for (auto& t : ranks)
    t.join();
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  ASSERT_EQ(rank0.train_paths.size(), 3u);
  for (std::size_t s = 0; s < 3; ++s)
    EXPECT_TRUE(bytes(one.train_paths[s]) == bytes(rank0.train_paths[s])) << "shard " << s;
  EXPECT_TRUE(bytes(one.val_paths.at(0)) == bytes(rank0.val_paths.at(0)));
  // The spill files are gone: the folder holds the shards only.
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir / "three"))
    ++files;
  EXPECT_EQ(files, 4u);
}

TEST(TextCorpus, JsonLinesRecordsAreDocumentsOfTheNamedField) {
  TempDir dir;
  auto f = write(dir, "r.jsonl",
                 "{\"id\": 1, \"meta\": {\"text\": \"nested\", \"a\": [1, -2.5e3, true, null]},"
                 " \"text\": \"caf\\u00e9 \\\"q\\\" \\ud83d\\ude00\\n\\t/\\/\"}\n"
                 "\n"
                 "{\"text\": \"  \"}\n"
                 "{\"text\":\"second\"}");
  TextCorpusOptions o;
  o.documents = DocumentSplit::Record;
  o.jsonl_field = "text";
  const auto s = tokenize_corpus({f}, *make_tokenizer("bytes"), o);
  EXPECT_EQ(s.train, stream({"caf\u00E9 \"q\" \U0001F600\n\t//", "second"}));
}

TEST(TextCorpus, ABadJsonLinesRecordIsAnErrorNamingFileAndLine) {
  TempDir dir;
  TextCorpusOptions o;
  o.documents = DocumentSplit::Record;
  o.jsonl_field = "text";
  auto tok = make_tokenizer("bytes");
  const std::pair<const char*, const char*> cases[] = {
      {"not json at all", "not a JSON Lines record: expected '{'"},
      {"{\"text\": \"unterminated}", "unterminated string"},
      {"{\"body\": \"x\"}", "has no field \"text\""},
      {"{\"text\": 42}", "field \"text\" is not a string"},
      {"{\"text\": \"x\"} trailing", "text after the object"},
      {"{\"text\": \"\\ud800\"}", "lone surrogate"},
  };
  for (const auto& [line, expected] : cases) {
    auto f = write(dir, "bad.jsonl", std::string("{\"text\": \"fine\"}\n") + line + "\n");
    const std::string msg = error_of([&] { tokenize_corpus({f}, *tok, o); });
    EXPECT_TRUE(contains(msg, f + ":2")) << msg;
    EXPECT_TRUE(contains(msg, expected)) << msg;
  }
}

TEST(TextCorpus, GzipAndZstdInputsReadAsTheirText) {
  TempDir dir;
  const std::string text = random_text(std::size_t{3} << 19, 5);
  auto plain = write(dir, "plain.txt", text);
  // gzip: two members, as `cat a.gz b.gz` makes; the name says nothing, the magic bytes do.
  const std::string gz = dir / "text.data";
  for (const auto& [mode, part] :
       {std::pair{"wb", text.substr(0, 1000)}, std::pair{"ab", text.substr(1000)}}) {
    gzFile g = gzopen(gz.c_str(), mode);
    ASSERT_NE(g, nullptr);
    ASSERT_EQ(gzwrite(g, part.data(), static_cast<unsigned>(part.size())),
              static_cast<int>(part.size()));
    gzclose(g);
  }
  std::string zst(ZSTD_compressBound(text.size()), '\0');
  zst.resize(ZSTD_compress(zst.data(), zst.size(), text.data(), text.size(), 3));
  auto zst_path = write(dir, "text.zst", zst);
  auto tok = make_tokenizer("bytes");
  TextCorpusOptions o;
  o.documents = DocumentSplit::Paragraph;
  const auto want = tokenize_corpus({plain}, *tok, o).train;
  EXPECT_TRUE(tokenize_corpus({gz}, *tok, o).train == want);
  EXPECT_TRUE(tokenize_corpus({zst_path}, *tok, o).train == want);

  // Damaged: a corrupted deflate stream, a truncated zstd frame.
  std::ifstream in(gz, std::ios::binary);
  std::string bad((std::istreambuf_iterator<char>(in)), {});
  for (std::size_t i = 100; i < 200; ++i)
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
  auto bad_gz = write(dir, "bad.gz", bad);
  std::string msg = error_of([&] { tokenize_corpus({bad_gz}, *tok, o); });
  EXPECT_TRUE(contains(msg, bad_gz + ": not a valid gzip stream at compressed byte offset")) << msg;
  auto cut_zst = write(dir, "cut.zst", zst.substr(0, zst.size() / 2));
  msg = error_of([&] { tokenize_corpus({cut_zst}, *tok, o); });
  EXPECT_TRUE(contains(msg, cut_zst + ": the zstd stream is truncated")) << msg;
}

TEST(TextCorpus, TooLittleMemoryOrADocumentLargerThanAnEighthOfItIsAnError) {
  TempDir dir;
  auto f = write(dir, "one.txt", "text");
  TextCorpusOptions o;
  o.memory_bytes = std::int64_t{16} << 20;
  std::string msg = error_of([&] { tokenize_corpus({f}, *make_tokenizer("bytes"), o); });
  EXPECT_TRUE(contains(msg, "is too little for 1 thread(s)")) << msg;
  EXPECT_TRUE(contains(msg, "raise --memory to 112MiB")) << msg;
  o.memory_bytes = std::int64_t{112} << 20;  // a document may take 14 MiB
  auto big = write(dir, "big.txt", std::string(std::size_t{15} << 20, 'a'));
  msg = error_of([&] { tokenize_corpus({big}, *make_tokenizer("bytes"), o); });
  EXPECT_TRUE(contains(msg, big + ": the document from line 1 is larger than")) << msg;
  EXPECT_TRUE(contains(msg, "--memory")) << msg;
}
