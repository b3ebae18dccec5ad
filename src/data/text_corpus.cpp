#include "lockstep/data/text_corpus.hpp"

#include <glob.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lockstep/core/error.hpp"

namespace lockstep::data {

namespace {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOCKSTEP_CHECK(in.good(), "cannot read text file ", path);
  std::ostringstream s;
  s << in.rdbuf();
  LOCKSTEP_CHECK(!in.bad(), "error while reading text file ", path);
  return s.str();
}

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
  });
}

struct Document {
  std::string text;
  std::int64_t line;  // of its first line in the file, for messages
};

// Cuts one file's text into its non-blank documents.
std::vector<Document> cut(const std::string& text, DocumentSplit mode) {
  std::vector<Document> docs;
  if (mode == DocumentSplit::File) {
    if (!blank(text)) docs.push_back({text, 1});
    return docs;
  }
  Document paragraph{"", 0};
  auto flush = [&] {
    if (!paragraph.text.empty()) docs.push_back(std::move(paragraph));
    paragraph = {"", 0};
  };
  std::int64_t line_no = 0;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    ++line_no;
    start = end + 1;
    if (blank(line)) {
      flush();
      continue;
    }
    if (mode == DocumentSplit::Line) {
      docs.push_back({std::string(line), line_no});
      continue;
    }
    if (paragraph.text.empty()) {
      paragraph.line = line_no;
    } else {
      paragraph.text += '\n';
    }
    paragraph.text += line;
  }
  flush();
  return docs;
}

}  // namespace

DocumentSplit document_split_from_name(const std::string& name) {
  if (name == "file") return DocumentSplit::File;
  if (name == "paragraph") return DocumentSplit::Paragraph;
  if (name == "line") return DocumentSplit::Line;
  LOCKSTEP_FAIL_HINT("--documents=file|paragraph|line", "unknown document split '", name, "'");
}

std::vector<std::string> expand_text_inputs(const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
      continue;
    }
    if (in.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      std::vector<std::string> matches;
      if (::glob(in.c_str(), 0, nullptr, &g) == 0) {
        for (std::size_t i = 0; i < g.gl_pathc; ++i)
          if (fs::is_regular_file(g.gl_pathv[i], ec)) matches.emplace_back(g.gl_pathv[i]);
      }
      globfree(&g);
      LOCKSTEP_CHECK_HINT(!matches.empty(), "check the pattern (quote it so the shell leaves it)",
                          "no text file matches --input=", in);
      std::sort(matches.begin(), matches.end());
      files.insert(files.end(), matches.begin(), matches.end());
      continue;
    }
    LOCKSTEP_FAIL_HINT("give text files or a quoted glob", "text input ", in,
                       fs::is_directory(in, ec) ? " is a folder"
                       : fs::exists(in, ec)     ? " is not a regular file"
                                                : " does not exist");
  }
  LOCKSTEP_CHECK_HINT(!files.empty(), "give --input=FILE (repeatable, or a quoted glob)",
                      "no text input given");
  return files;
}

TokenSplits tokenize_corpus(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                            const TextCorpusOptions& options) {
  const double f = options.val_fraction;
  LOCKSTEP_CHECK_HINT(f >= 0 && f < 1, "e.g. --val-fraction=0.05", "--val-fraction=", f,
                      " is outside [0, 1)");
  TokenSplits out;
  std::int64_t d = 0;
  for (const auto& path : files) {
    const std::string text = read_text_file(path);
    check_utf8(text, path);
    for (const Document& doc : cut(text, options.documents)) {
      const bool val =
          std::floor(static_cast<double>(d + 1) * f) > std::floor(static_cast<double>(d) * f);
      auto& stream = val ? out.val : out.train;
      stream.push_back(tokenizer.eot_token());
      try {
        tokenizer.encode(doc.text, stream);
      } catch (const Error& e) {
        LOCKSTEP_FAIL_HINT(e.hint(), path, ", document from line ", doc.line, ": ", e.message());
      }
      (val ? out.val_documents : out.train_documents) += 1;
      out.text_bytes += static_cast<std::int64_t>(doc.text.size());
      ++d;
    }
  }
  std::string names =
      files.front() + (files.size() > 1 ? str(" and ", files.size() - 1, " more") : "");
  LOCKSTEP_CHECK_HINT(d > 0, "give files that hold text", "empty corpus: ", names,
                      " hold no document with a visible character");
  LOCKSTEP_CHECK_HINT(f == 0 || out.val_documents > 0,
                      "raise --val-fraction, or cut the text into more documents with "
                      "--documents=paragraph or --documents=line",
                      "--val-fraction=", f, " of ", d, " document(s) in ", names,
                      " selects no validation document");
  LOCKSTEP_CHECK_HINT(out.train_documents > 0, "lower --val-fraction", "--val-fraction=", f, " of ",
                      d, " document(s) in ", names, " leaves no training document");
  return out;
}

}  // namespace lockstep::data
