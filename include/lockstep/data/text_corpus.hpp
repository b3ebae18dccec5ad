// Text corpora for `lockstep-shard text`: files are read (and must be UTF-8), cut into documents,
// and tokenized into a train and a validation stream in the token-shard convention (every
// document preceded by the end-of-text token). The split is by document and needs no RNG:
// document d of D goes to validation when floor((d+1)F) > floor(dF), i.e. floor(D*F) documents
// evenly spread over the corpus, so validation text comes from all of it, not only its end.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/data/tokenizer.hpp"

namespace lockstep::data {

// How files are cut into documents. Blank = empty or whitespace only; a "\r" before "\n" is
// dropped in line and paragraph modes. Documents with no visible character are skipped.
enum class DocumentSplit {
  File,       // each file is one document, as it is
  Paragraph,  // runs of non-blank lines, separated by blank lines, joined with "\n"
  Line,       // each non-blank line
};
DocumentSplit document_split_from_name(const std::string& name);  // file | paragraph | line

struct TextCorpusOptions {
  DocumentSplit documents = DocumentSplit::File;
  double val_fraction = 0;  // in [0, 1); 0: no validation split
};

struct TokenSplits {
  std::vector<std::int32_t> train, val;
  std::int64_t train_documents = 0;
  std::int64_t val_documents = 0;
  std::int64_t text_bytes = 0;  // bytes of the documents kept
};

// Expands --input values: an existing file stays; a pattern with * ? [ becomes its matches
// (sorted; none is an error); anything else that is not a regular file is an error naming it.
std::vector<std::string> expand_text_inputs(const std::vector<std::string>& inputs);

// Errors name the file: not UTF-8 (byte offset, line, column), unreadable, the tokenizer refusing
// a document (with its first line); and the corpus: no document at all ("empty corpus"), or a
// validation fraction that selects no document or every document.
TokenSplits tokenize_corpus(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                            const TextCorpusOptions& options);

}  // namespace lockstep::data
