// Token shards, the text member of the lockstep shard family (docs/SHARD-FORMAT.md, "Token
// shards"): one file holds a contiguous piece of a set's token stream as /tokens (uint16 when the
// vocabulary fits, else uint32, [n], chunked) with the attributes format, version, kind =
// "tokens", shard_index, num_shards, tokenizer, vocab_size and eot_token. In the stream every
// document is preceded by eot_token. Writers and readers check every id against vocab_size.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lockstep/data/defaults.hpp"

namespace lockstep::data {

inline constexpr const char* kTokenShardKind = "tokens";

struct TokenShardMeta {
  std::int64_t shard_index = 0;
  std::int64_t num_shards = 1;
  std::string tokenizer;        // "bytes", "gpt2": what decodes the ids
  std::int64_t vocab_size = 0;  // every id is in [0, vocab_size)
  std::int64_t eot_token = 0;   // the document separator, < vocab_size
  std::int64_t num_tokens = 0;  // length of /tokens (set by the writer on close)

  // Bytes one token takes in the file: 2 while every id fits in uint16, else 4.
  int token_bytes() const { return vocab_size <= 65536 ? 2 : 4; }
};

// Writes one token shard, as PATH.tmp renamed to PATH by close() (as ShardWriter does).
class TokenShardWriter {
 public:
  // meta.num_tokens is ignored.
  TokenShardWriter(const std::string& path, const TokenShardMeta& meta,
                   int deflate_level = kDefaultDeflateLevel);
  ~TokenShardWriter();  // discards the temporary file if close() was not called
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  // Appends ids, each checked against [0, vocab_size).
  void append(std::span<const std::int32_t> tokens);
  void close();
  std::int64_t num_tokens() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One opened, validated token shard; reads are thread-safe (serialised by the HDF5 lock).
class TokenShardFile {
 public:
  // Checks every attribute and /tokens' type and shape; throws naming the file and the field.
  static std::unique_ptr<TokenShardFile> open(
      const std::string& path, std::size_t chunk_cache_bytes = kDefaultChunkCacheBytes);
  ~TokenShardFile();
  TokenShardFile(const TokenShardFile&) = delete;
  TokenShardFile& operator=(const TokenShardFile&) = delete;

  const std::string& path() const { return path_; }
  const TokenShardMeta& meta() const { return meta_; }
  // "/data/train-00003-of-00008.h5 (token shard 3 of 8)", for messages.
  std::string where() const;

  // Tokens [begin, begin + count) into out; an id >= vocab_size is an Error naming the file, the
  // position in the shard and the value. T is std::uint16_t (only for 2-byte shards) or int32.
  template <class T>
  void read(std::int64_t begin, std::int64_t count, T* out) const;

 private:
  TokenShardFile() = default;
  std::string path_;
  TokenShardMeta meta_;
  std::int64_t file_ = -1;  // hid_t
  std::int64_t tokens_ = -1;
};

// True when path is an HDF5 file whose 'kind' attribute says "tokens"; false for image shards
// and for anything that cannot be opened (the image reader then names the problem).
bool is_token_shard(const std::string& path);

// Writes `tokens` as num_shards files DIR/NAME-XXXXX-of-NNNNN.h5 of near-equal length, in order
// (shard s holds tokens [s*n/S, (s+1)*n/S)), and returns their paths. meta's shard_index and
// num_shards are set per file.
std::vector<std::string> write_token_set(std::span<const std::int32_t> tokens,
                                         const std::string& out_dir, const std::string& name,
                                         std::int64_t num_shards, const TokenShardMeta& meta,
                                         int deflate_level = kDefaultDeflateLevel);

}  // namespace lockstep::data
