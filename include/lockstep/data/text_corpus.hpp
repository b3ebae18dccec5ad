// Text corpora for `lockstep-shard text`: inputs are streamed (plain, gzip or zstd; files, globs,
// folders or stdin), cut into documents, and tokenized into a train and a validation stream in the
// token-shard convention (every document preceded by the end-of-text token), with bounded memory
// whatever the corpus size.
//
// Note [Text determinism]: the output depends only on the inputs and the options that shape it,
// never on --threads, --memory or the number of MPI ranks. Documents are numbered in the order of
// the inputs and of their place in each; the reader groups them into chunks of about
// kTextChunkBytes, cut at document boundaries by text size alone; threads (and ranks: chunk c
// belongs to rank c mod R) encode chunks in any order, and the tokens are put back in chunk order.
// The split is by document number and needs no RNG: document d of D goes to validation when
// floor((d+1)F) > floor(dF), i.e. floor(D*F) documents evenly spread over the corpus, so
// validation text comes from all of it, not only its end.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/data/token_shard.hpp"
#include "lockstep/data/tokenizer.hpp"

namespace lockstep::data {

// How inputs are cut into documents. Blank = empty or whitespace only; a "\r" before "\n" is
// dropped in line and paragraph modes. Documents with no visible character are skipped.
enum class DocumentSplit {
  File,       // each file is one document, as it is
  Paragraph,  // runs of non-blank lines, separated by blank lines, joined with "\n"
  Line,       // each non-blank line
  Record,     // JSON Lines: the string field TextCorpusOptions::jsonl_field of each line's object
};
DocumentSplit document_split_from_name(const std::string& name);  // file|paragraph|line|record

// The memory `lockstep-shard text` may use (--memory): chunks in flight between the reader, the
// encoding threads and the writer are bounded by what is left of it after the vocabulary and
// each thread's piece cache (kTextThreadBytes), of which at least 16 MiB must be left (so 256 MiB
// allows 5 threads; more need more). 256 MiB keeps a 2-thread GPT-2 run near full speed (see
// docs/PERFORMANCE.md); a document may take at most 1/8 of it.
inline constexpr std::int64_t kDefaultTextMemoryBytes = std::int64_t{256} << 20;
inline constexpr std::int64_t kTextBaseBytes = std::int64_t{64} << 20;    // vocabulary, buffers
inline constexpr std::int64_t kTextThreadBytes = std::int64_t{32} << 20;  // a thread's caches
// Text per chunk, the unit of work of a thread and of a rank. Fixed (Note [Text determinism]):
// 1 MiB is a tenth of a second of GPT-2 encoding, small next to a run and large next to the
// cost of handing a chunk over.
inline constexpr std::int64_t kTextChunkBytes = std::int64_t{1} << 20;

struct TextCorpusOptions {
  DocumentSplit documents = DocumentSplit::File;
  std::string jsonl_field;  // the field Record reads (e.g. "text", as FineWeb's dumps hold it)
  double val_fraction = 0;  // in [0, 1); 0: no validation split
  int threads = 1;          // encoding threads (the reader and the writer run beside them)
  std::int64_t memory_bytes = kDefaultTextMemoryBytes;
  bool progress = false;  // a progress line on stderr about every 2 s
};

// What the reader saw: the same on every rank.
struct CorpusCounts {
  std::int64_t train_documents = 0, val_documents = 0;
  std::int64_t text_bytes = 0;  // bytes of the documents kept
  std::int64_t chunks = 0;
};

// Receives, in chunk order, the tokens of the chunks rank `rank` of `ranks` encodes.
using ChunkSink = std::function<void(std::int64_t chunk, std::span<const std::int32_t> train,
                                     std::span<const std::int32_t> val)>;

// Expands --input values: "-" is stdin; an existing file stays; a folder becomes the regular files
// under it (recursively, sorted); a pattern with * ? [ becomes its matches (sorted; none is an
// error); anything else is an error naming it.
std::vector<std::string> expand_text_inputs(const std::vector<std::string>& inputs);

// Streams the corpus through the tokenizer, handing this rank's chunks to sink in order. Errors
// name the file: not UTF-8 (byte offset, line, column), unreadable or damaged (compressed byte
// offset), a JSON Lines record that is not JSON or lacks the field (line), a document larger than
// memory_bytes / 8, the tokenizer refusing a document (with its first line); and the corpus: no
// document at all ("empty corpus"), or a validation fraction that selects no document or every
// document. Every rank reads the whole corpus and throws the same reader errors.
CorpusCounts encode_corpus(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                           const TextCorpusOptions& options, int rank, int ranks,
                           const ChunkSink& sink);

// The whole corpus in memory (tests, small corpora): encode_corpus with one rank.
struct TokenSplits {
  std::vector<std::int32_t> train, val;
  std::int64_t train_documents = 0;
  std::int64_t val_documents = 0;
  std::int64_t text_bytes = 0;
};
TokenSplits tokenize_corpus(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                            const TextCorpusOptions& options);

// Token shards of a corpus of any size, written by R ranks together (R = 1 without MPI): each
// rank encodes its chunks into spill files in out_dir (so out_dir must be a folder every rank
// sees), `barrier` waits for all ranks, and rank 0 writes the shards in chunk order exactly as
// write_token_set would from the whole stream (the same files, byte for byte), then removes the
// spill files. Returns the counts and, on rank 0, the shard paths of each set.
struct TextShardPlan {
  std::string out_dir, name = "train", val_name = "val";
  std::int64_t shards = 1, val_shards = 1;
  TokenShardMeta meta;  // tokenizer, vocab_size, eot_token
  int deflate_level = kDefaultDeflateLevel;
};
struct TextShardResult {
  CorpusCounts counts;
  std::int64_t train_tokens = 0, val_tokens = 0;  // on rank 0
  std::vector<std::string> train_paths, val_paths;
};
TextShardResult shard_corpus(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                             const TextCorpusOptions& options, const TextShardPlan& plan, int rank,
                             int ranks, const std::function<void()>& barrier);

}  // namespace lockstep::data
