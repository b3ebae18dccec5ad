// Private to the data layer (and its tests): how `lockstep-shard text` reads its inputs. A
// TextSource yields a file's bytes in blocks, decompressing gzip and zstd streams (told apart by
// their magic bytes, not their names) and reading "-" as stdin; json_string_field takes one
// document out of a JSON Lines record. Both throw Errors that name the file and the offset or line.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace lockstep::data {

class TextSource {
 public:
  virtual ~TextSource() = default;
  // Up to n bytes of the (decompressed) text into buf; 0 only at its end.
  virtual std::size_t read(char* buf, std::size_t n) = 0;
  // Bytes taken from the file itself so far (compressed bytes for a compressed file): progress
  // against input_size().
  virtual std::int64_t consumed() const = 0;
  // "gzip", "zstd" or "plain": for messages.
  virtual const char* kind() const = 0;
};

// Opens path ("-": stdin). A gzip stream may hold several members (as `cat a.gz b.gz` makes).
std::unique_ptr<TextSource> open_text_source(const std::string& path);

// The size of the file on disk (-1 for stdin), for a progress line's ETA.
std::int64_t input_size(const std::string& path);

// The string value of the top-level key `field` of the JSON object on `line` (one JSON Lines
// record), unescaped (\uXXXX, surrogate pairs included) into out. The whole line must be one JSON
// object. Throws an Error naming `where` (file:line) when the line is not a JSON object, lacks the
// field, or the field is not a string.
void json_string_field(std::string_view line, std::string_view field, std::string& out,
                       const std::string& where);

}  // namespace lockstep::data
