#include "lockstep/data/text_corpus.hpp"

#include <glob.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "lockstep/core/error.hpp"
#include "lockstep/core/utf8.hpp"
#include "lockstep/data/shard.hpp"
#include "text_input.hpp"

namespace lockstep::data {

namespace {

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
  });
}

// ---- chunks: documents back to back, the unit of work (Note [Text determinism])
struct DocRef {
  std::size_t begin, size;
  std::size_t file;   // index into the inputs, for messages
  std::int64_t line;  // of the document's first line in its file
  bool val;
};

struct Chunk {
  std::int64_t index = 0;
  std::string text;
  std::vector<DocRef> docs;
  std::vector<std::int32_t> train, val;  // filled by a worker
  std::exception_ptr error;
  std::int64_t charge = 0;  // bytes counted against the in-flight budget
};

// The reader's side: cuts each input into documents and documents into chunks.
class Cutter {
 public:
  Cutter(const std::vector<std::string>& files, const TextCorpusOptions& o, int rank, int ranks,
         std::function<void(std::unique_ptr<Chunk>)> emit)
      : files_(files),
        o_(o),
        rank_(rank),
        ranks_(ranks),
        emit_(std::move(emit)),
        max_document_(std::max<std::int64_t>(o.memory_bytes / 8, 1)) {}

  // Reads every input; `consumed` is updated with the input bytes taken so far.
  void run(std::atomic<std::int64_t>& consumed) {
    std::int64_t done_bytes = 0;
    for (std::size_t f = 0; f < files_.size(); ++f) {
      file_ = f;
      read_file(consumed, done_bytes);
    }
    flush_chunk();
  }
  std::int64_t documents() const { return d_; }
  const CorpusCounts& counts() const { return counts_; }

 private:
  const std::string& path() const { return files_[file_]; }

  void read_file(std::atomic<std::int64_t>& consumed, std::int64_t& done_bytes) {
    auto source = open_text_source(path());
    std::string pending;  // text read and not yet cut: at most one partial line
    line_no_ = 0;
    offset_ = 0;
    line_start_ = 0;
    paragraph_.clear();
    std::vector<char> block(static_cast<std::size_t>(kTextChunkBytes));
    const bool whole = o_.documents == DocumentSplit::File;
    for (;;) {
      const std::size_t got = source->read(block.data(), block.size());
      consumed.store(done_bytes + source->consumed(), std::memory_order_relaxed);
      if (got == 0) break;
      pending.append(block.data(), got);
      if (whole) {
        check_size(static_cast<std::int64_t>(pending.size()), 1);
        continue;
      }
      const std::size_t last_newline = pending.rfind('\n');
      if (last_newline == std::string::npos) {
        check_size(static_cast<std::int64_t>(pending.size()), line_no_ + 1);
        continue;
      }
      cut_lines(std::string_view(pending).substr(0, last_newline + 1));
      pending.erase(0, last_newline + 1);
    }
    done_bytes += source->consumed();
    if (whole) {
      check_utf8_at(pending);
      if (!blank(pending)) add_document(pending, 1);
      return;
    }
    if (!pending.empty()) cut_lines(pending);  // a last line without "\n"
    end_paragraph();
  }

  void check_size(std::int64_t bytes, std::int64_t line) const {
    LOCKSTEP_CHECK_HINT(bytes <= max_document_,
                        "cut the text into smaller documents (--documents=paragraph or line), or "
                        "raise --memory",
                        path(), ": the document from line ", line, " is larger than ",
                        max_document_, " bytes, 1/8 of --memory");
  }

  // The UTF-8 check of `text`, which starts at offset_ of the file, in the words of check_utf8
  // but with the file's offsets and lines.
  void check_utf8_at(std::string_view text) {
    for (std::size_t i = 0; i < text.size();) {
      const auto c = static_cast<unsigned char>(text[i]);
      if (c < 0x80) {  // the common case, without a call
        if (c == '\n') line_start_ = offset_ + static_cast<std::int64_t>(i) + 1;
        ++i;
        continue;
      }
      char32_t cp;
      const int len = utf8::decode(text, i, cp);
      if (len == 0) {
        const std::int64_t at = offset_ + static_cast<std::int64_t>(i);
        std::int64_t line = line_no_ + 1;
        for (std::size_t k = 0; k < i; ++k)
          line += text[k] == '\n';
        LOCKSTEP_FAIL_HINT("convert it to UTF-8 first, e.g. iconv -f latin1 -t utf-8", path(),
                           " is not UTF-8: byte 0x", std::hex, static_cast<int>(c), std::dec,
                           " at byte offset ", at, " (line ", line, ", column ",
                           at - line_start_ + 1, ") does not start a well-formed UTF-8 sequence");
      }
      i += static_cast<std::size_t>(len);
    }
  }

  // Whole lines (each ending in "\n", but perhaps the file's last).
  void cut_lines(std::string_view text) {
    check_utf8_at(text);
    for (std::size_t start = 0; start < text.size();) {
      std::size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string_view line = text.substr(start, end - start);
      start = end + 1;
      ++line_no_;
      if (o_.documents == DocumentSplit::Record) {
        if (blank(line)) continue;
        json_string_field(line, o_.jsonl_field, record_, str(path(), ":", line_no_));
        check_size(static_cast<std::int64_t>(record_.size()), line_no_);
        if (!blank(record_)) add_document(record_, line_no_);
        continue;
      }
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (blank(line)) {
        end_paragraph();
        continue;
      }
      if (o_.documents == DocumentSplit::Line) {
        check_size(static_cast<std::int64_t>(line.size()), line_no_);
        add_document(line, line_no_);
        continue;
      }
      if (paragraph_.empty()) {
        paragraph_line_ = line_no_;
      } else {
        paragraph_ += '\n';
      }
      paragraph_ += line;
      check_size(static_cast<std::int64_t>(paragraph_.size()), paragraph_line_);
    }
    offset_ += static_cast<std::int64_t>(text.size());
  }

  void end_paragraph() {
    if (paragraph_.empty()) return;
    add_document(paragraph_, paragraph_line_);
    paragraph_.clear();
  }

  void add_document(std::string_view text, std::int64_t line) {
    const double f = o_.val_fraction;
    const bool val =
        std::floor(static_cast<double>(d_ + 1) * f) > std::floor(static_cast<double>(d_) * f);
    ++d_;
    (val ? counts_.val_documents : counts_.train_documents) += 1;
    counts_.text_bytes += static_cast<std::int64_t>(text.size());
    if (!chunk_) {
      chunk_ = std::make_unique<Chunk>();
      chunk_->index = counts_.chunks++;
    }
    // A chunk other ranks encode is only counted: its text is never kept.
    if (chunk_->index % ranks_ == rank_) {
      chunk_->docs.push_back({chunk_->text.size(), text.size(), file_, line, val});
      chunk_->text += text;
    }
    chunk_bytes_ += static_cast<std::int64_t>(text.size());
    if (chunk_bytes_ >= kTextChunkBytes) flush_chunk();
  }

  void flush_chunk() {
    if (chunk_ && chunk_->index % ranks_ == rank_) emit_(std::move(chunk_));
    chunk_.reset();
    chunk_bytes_ = 0;
  }

  const std::vector<std::string>& files_;
  const TextCorpusOptions& o_;
  const int rank_, ranks_;
  std::function<void(std::unique_ptr<Chunk>)> emit_;
  const std::int64_t max_document_;

  std::size_t file_ = 0;
  std::int64_t line_no_ = 0, offset_ = 0, line_start_ = 0;
  std::string paragraph_, record_;
  std::int64_t paragraph_line_ = 0;
  std::int64_t d_ = 0;  // documents so far, the number of the next
  CorpusCounts counts_;
  std::unique_ptr<Chunk> chunk_;
  std::int64_t chunk_bytes_ = 0;
};

// Chunks between the reader, the encoding threads and the in-order consumer, with the bytes in
// flight bounded: the reader waits while a new chunk would exceed the budget (unless nothing is in
// flight, so one chunk always fits).
class ChunkPipeline {
 public:
  explicit ChunkPipeline(std::int64_t budget) : budget_(budget) {}

  void push(std::unique_ptr<Chunk> c) {
    std::unique_lock lock(m_);
    space_.wait(lock,
                [&] { return stop_ || in_flight_ == 0 || in_flight_ + c->charge <= budget_; });
    if (stop_) throw Stopped{};
    in_flight_ += c->charge;
    order_.push_back(c->index);
    todo_.push_back(std::move(c));
    work_.notify_one();
    done_cv_.notify_all();
  }
  void reader_finished(std::exception_ptr error) {
    std::lock_guard lock(m_);
    reader_done_ = true;
    reader_error_ = error;
    work_.notify_all();
    done_cv_.notify_all();
  }
  // A worker: encodes chunks until the reader is done and nothing is left, or stop().
  void work(const std::function<void(Chunk&)>& encode) {
    for (;;) {
      std::unique_ptr<Chunk> c;
      {
        std::unique_lock lock(m_);
        work_.wait(lock, [&] { return stop_ || !todo_.empty() || reader_done_; });
        if (stop_ || todo_.empty()) return;
        c = std::move(todo_.front());
        todo_.pop_front();
      }
      try {
        encode(*c);
      } catch (...) {
        c->error = std::current_exception();
      }
      std::lock_guard lock(m_);
      const auto index = c->index;
      done_.emplace(index, std::move(c));
      done_cv_.notify_all();
    }
  }
  // The next chunk in order, encoded; null at the end. Rethrows the chunk's or the reader's error.
  std::unique_ptr<Chunk> next() {
    std::unique_lock lock(m_);
    done_cv_.wait(lock, [&] {
      return stop_ || (!order_.empty() && done_.count(order_.front())) ||
             (order_.empty() && reader_done_);
    });
    if (order_.empty()) {
      if (reader_error_) std::rethrow_exception(reader_error_);
      return nullptr;
    }
    auto it = done_.find(order_.front());
    auto c = std::move(it->second);
    done_.erase(it);
    order_.pop_front();
    if (c->error) std::rethrow_exception(c->error);
    return c;
  }
  void release(const Chunk& c) {
    std::lock_guard lock(m_);
    in_flight_ -= c.charge;
    space_.notify_all();
  }
  void stop() {
    std::lock_guard lock(m_);
    stop_ = true;
    space_.notify_all();
    work_.notify_all();
    done_cv_.notify_all();
  }
  struct Stopped {};

 private:
  const std::int64_t budget_;
  std::mutex m_;
  std::condition_variable space_, work_, done_cv_;
  std::deque<std::unique_ptr<Chunk>> todo_;
  std::deque<std::int64_t> order_;  // indices pushed, in order, not yet consumed
  std::map<std::int64_t, std::unique_ptr<Chunk>> done_;
  std::int64_t in_flight_ = 0;
  bool reader_done_ = false, stop_ = false;
  std::exception_ptr reader_error_;
};

// "text 31.2 MB/s, read 1.2 GiB of 4.0 GiB, 95604 documents, 28844544 tokens, ETA 0:01:37": the
// rate is of text encoded (decompressed); the ETA is from the input read against its size on disk
// (none for stdin).
class ProgressLine {
 public:
  ProgressLine(bool on, std::int64_t total) : on_(on), total_(total), start_(Clock::now()) {}
  void update(std::int64_t read, std::int64_t text, std::int64_t docs, std::int64_t tokens,
              bool last = false) {
    if (!on_) return;
    const auto now = Clock::now();
    if (!last && now - shown_ < std::chrono::seconds(2)) return;
    shown_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    char rate[32];
    std::snprintf(rate, sizeof rate, "%.1f", s > 0 ? static_cast<double>(text) / s / 1e6 : 0.0);
    std::string line = str("text ", rate, " MB/s, read ", format_bytes(static_cast<double>(read)));
    if (total_ > 0) line += str(" of ", format_bytes(static_cast<double>(total_)));
    line += str(", ", docs, " documents, ", tokens, " tokens");
    if (total_ > 0 && read > 0 && !last) {
      const auto eta = static_cast<std::int64_t>(s * static_cast<double>(total_ - read) /
                                                 static_cast<double>(read));
      char buf[32];
      std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(eta / 3600),
                    static_cast<long long>(eta / 60 % 60), static_cast<long long>(eta % 60));
      line += str(", ETA ", buf);
    }
    std::fprintf(stderr, "\r%-100s%s", line.c_str(), last ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool on_;
  std::int64_t total_;
  Clock::time_point start_, shown_ = start_;
};

}  // namespace

DocumentSplit document_split_from_name(const std::string& name) {
  if (name == "file") return DocumentSplit::File;
  if (name == "paragraph") return DocumentSplit::Paragraph;
  if (name == "line") return DocumentSplit::Line;
  if (name == "record") return DocumentSplit::Record;
  LOCKSTEP_FAIL_HINT("--documents=file|paragraph|line|record", "unknown document split '", name,
                     "'");
}

std::vector<std::string> expand_text_inputs(const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (in == "-" || fs::is_regular_file(in, ec)) {
      files.push_back(in);
      continue;
    }
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> under;
      for (const auto& e : fs::recursive_directory_iterator(in, ec))
        if (e.is_regular_file(ec)) under.push_back(e.path().string());
      LOCKSTEP_CHECK_HINT(!under.empty(), "give a folder that holds text files",
                          "text input folder ", in, " holds no file");
      std::sort(under.begin(), under.end());
      files.insert(files.end(), under.begin(), under.end());
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
    LOCKSTEP_FAIL_HINT("give text files, folders, a quoted glob or - for stdin", "text input ", in,
                       fs::exists(in, ec) ? " is not a regular file" : " does not exist");
  }
  LOCKSTEP_CHECK_HINT(!files.empty(), "give --input=FILE (repeatable, or a quoted glob)",
                      "no text input given");
  return files;
}

CorpusCounts encode_corpus(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                           const TextCorpusOptions& options, int rank, int ranks,
                           const ChunkSink& sink) {
  const double f = options.val_fraction;
  LOCKSTEP_CHECK_HINT(f >= 0 && f < 1, "e.g. --val-fraction=0.05", "--val-fraction=", f,
                      " is outside [0, 1)");
  LOCKSTEP_CHECK_HINT(options.threads >= 1, "e.g. --threads=2", "--threads=", options.threads,
                      " must be at least 1");
  LOCKSTEP_CHECK_HINT(options.documents != DocumentSplit::Record || !options.jsonl_field.empty(),
                      "e.g. --jsonl-field=text", "JSON Lines records need the field to read");
  LOCKSTEP_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "rank ", rank, " of ", ranks);
  // Every rank reads every input, and a launcher gives stdin to one rank only.
  LOCKSTEP_CHECK_HINT(ranks == 1 || std::find(files.begin(), files.end(), "-") == files.end(),
                      "save the text to a file every rank can read, or run without mpirun",
                      "--input=- (stdin) cannot be read by ", ranks, " ranks");
  // The vocabulary and buffers, each thread's caches, and at least 16 MiB of chunks in flight.
  const std::int64_t fixed = kTextBaseBytes + options.threads * kTextThreadBytes;
  const std::int64_t needed = fixed + (std::int64_t{16} << 20);
  LOCKSTEP_CHECK_HINT(options.memory_bytes >= needed,
                      str("raise --memory to ", needed >> 20, "MiB or more, or use fewer threads"),
                      "--memory=", format_bytes(static_cast<double>(options.memory_bytes)),
                      " is too little for ", options.threads, " thread(s): 64 MiB, 32 MiB a thread",
                      " and 16 MiB of text in flight");
  const std::int64_t budget = options.memory_bytes - fixed;

  std::int64_t total = 0;
  for (const auto& path : files) {
    const std::int64_t size = input_size(path);
    total = size < 0 || total < 0 ? -1 : total + size;
  }
  ChunkPipeline pipe(budget);
  std::atomic<std::int64_t> consumed{0};
  Cutter cutter(files, options, rank, ranks, [&](std::unique_ptr<Chunk> c) {
    // Tokens are at most one per byte and one end-of-text per document, 4 bytes each.
    c->charge = static_cast<std::int64_t>(c->text.size() + c->docs.size() * sizeof(DocRef) +
                                          4 * (c->text.size() + c->docs.size()));
    pipe.push(std::move(c));
  });
  auto encode = [&](Chunk& c) {
    for (const DocRef& d : c.docs) {
      auto& stream = d.val ? c.val : c.train;
      stream.push_back(tokenizer.eot_token());
      try {
        tokenizer.encode(std::string_view(c.text).substr(d.begin, d.size), stream);
      } catch (const Error& e) {
        LOCKSTEP_FAIL_HINT(e.hint(), files[d.file], ", document from line ", d.line, ": ",
                           e.message());
      }
    }
    c.text = std::string();
  };

  std::vector<std::thread> threads;
  struct Joiner {  // on every way out: stop the pipeline, then wait for its threads
    ChunkPipeline& pipe;
    std::vector<std::thread>& threads;
    ~Joiner() {
      pipe.stop();
      for (auto& t : threads)
        if (t.joinable()) t.join();
    }
  } joiner{pipe, threads};
  threads.emplace_back([&] {
    try {
      cutter.run(consumed);
      pipe.reader_finished(nullptr);
    } catch (const ChunkPipeline::Stopped&) {
      pipe.reader_finished(nullptr);
    } catch (...) {
      pipe.reader_finished(std::current_exception());
    }
  });
  for (int t = 0; t < options.threads; ++t)
    threads.emplace_back([&] { pipe.work(encode); });

  ProgressLine progress(options.progress, total);
  std::int64_t docs = 0, tokens = 0, text = 0;
  while (auto c = pipe.next()) {
    sink(c->index, c->train, c->val);
    docs += static_cast<std::int64_t>(c->docs.size());
    tokens += static_cast<std::int64_t>(c->train.size() + c->val.size());
    for (const DocRef& d : c->docs)
      text += static_cast<std::int64_t>(d.size);
    pipe.release(*c);
    progress.update(consumed.load(std::memory_order_relaxed), text, docs, tokens);
  }
  progress.update(consumed.load(std::memory_order_relaxed), text, docs, tokens, true);

  const CorpusCounts counts = cutter.counts();
  const std::int64_t d = cutter.documents();
  const std::string names =
      files.front() + (files.size() > 1 ? str(" and ", files.size() - 1, " more") : "");
  LOCKSTEP_CHECK_HINT(d > 0, "give files that hold text", "empty corpus: ", names,
                      " hold no document with a visible character");
  LOCKSTEP_CHECK_HINT(f == 0 || counts.val_documents > 0,
                      "raise --val-fraction, or cut the text into more documents with "
                      "--documents=paragraph or --documents=line",
                      "--val-fraction=", f, " of ", d, " document(s) in ", names,
                      " selects no validation document");
  LOCKSTEP_CHECK_HINT(counts.train_documents > 0, "lower --val-fraction", "--val-fraction=", f,
                      " of ", d, " document(s) in ", names, " leaves no training document");
  return counts;
}

TokenSplits tokenize_corpus(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                            const TextCorpusOptions& options) {
  TokenSplits out;
  const CorpusCounts counts = encode_corpus(
      files, tokenizer, options, 0, 1,
      [&](std::int64_t, std::span<const std::int32_t> train, std::span<const std::int32_t> val) {
        out.train.insert(out.train.end(), train.begin(), train.end());
        out.val.insert(out.val.end(), val.begin(), val.end());
      });
  out.train_documents = counts.train_documents;
  out.val_documents = counts.val_documents;
  out.text_bytes = counts.text_bytes;
  return out;
}

// ---- shards through spill files
namespace {

// One rank's spill: per set a file of raw ids (native order: it never leaves the run; uint16 when
// the vocabulary fits, as in the shards, else int32) and the token count of each of the rank's
// chunks.
struct Spill {
  std::string path;
  std::FILE* file = nullptr;
  bool narrow = false;  // ids stored as uint16
  std::vector<std::uint16_t> scratch;
  explicit Spill(std::string p, const char* mode, bool narrow_ids = false)
      : path(std::move(p)), narrow(narrow_ids) {
    file = std::fopen(path.c_str(), mode);
    LOCKSTEP_CHECK_HINT(file != nullptr, "is --out a folder every rank can write?",
                        "cannot open the spill file ", path, ": ", std::strerror(errno));
  }
  ~Spill() {
    if (file) std::fclose(file);
  }
  Spill(const Spill&) = delete;
  Spill& operator=(const Spill&) = delete;
  template <class T>
  void write(const T* data, std::size_t n) {
    LOCKSTEP_CHECK_HINT(n == 0 || std::fwrite(data, sizeof(T), n, file) == n, "is the disk full?",
                        "cannot write the spill file ", path);
  }
  template <class T>
  void read(T* data, std::size_t n) {
    LOCKSTEP_CHECK(n == 0 || std::fread(data, sizeof(T), n, file) == n, "the spill file ", path,
                   " is shorter than its index");
  }
  void write_ids(std::span<const std::int32_t> ids) {
    if (!narrow) return write(ids.data(), ids.size());
    scratch.assign(ids.begin(), ids.end());  // every id < vocab_size <= 65536
    write(scratch.data(), scratch.size());
  }
  void read_ids(std::int32_t* ids, std::size_t n) {
    if (!narrow) return read(ids, n);
    scratch.resize(n);
    read(scratch.data(), n);
    std::copy(scratch.begin(), scratch.end(), ids);
  }
  void close() {
    LOCKSTEP_CHECK_HINT(std::fclose(file) == 0, "is the disk full?", "cannot write the spill file ",
                        path);
    file = nullptr;
  }
};

std::string spill_path(const TextShardPlan& plan, int rank, const char* what) {
  return str(plan.out_dir, "/.", plan.name, ".spill-rank", rank, ".", what, ".tmp");
}

// Appends a set's stream to its shards in the pieces write_token_set uses, so the files are the
// same byte for byte: shard s holds tokens [s*n/S, (s+1)*n/S), appended in blocks of 2^20 from
// its first token.
class ShardSetWriter {
 public:
  ShardSetWriter(std::int64_t n, const TextShardPlan& plan, const std::string& name,
                 std::int64_t shards)
      : n_(n), plan_(plan), name_(name), shards_(shards) {
    LOCKSTEP_CHECK(shards >= 1, "--shards must be at least 1, got ", shards);
    LOCKSTEP_CHECK_HINT(n >= shards, "use fewer shards", "cannot split ", n, " tokens of '", name,
                        "' into ", shards, " non-empty shards");
  }
  void push(std::span<const std::int32_t> tokens) {
    while (!tokens.empty()) {
      if (!writer_) open_next();
      const std::int64_t take = std::min({static_cast<std::int64_t>(tokens.size()), end_ - at_,
                                          kBlock - static_cast<std::int64_t>(block_.size())});
      block_.insert(block_.end(), tokens.begin(), tokens.begin() + take);
      tokens = tokens.subspan(static_cast<std::size_t>(take));
      at_ += take;
      if (static_cast<std::int64_t>(block_.size()) == kBlock || at_ == end_) {
        writer_->append(block_);
        block_.clear();
      }
      if (at_ == end_) {
        writer_->close();
        writer_.reset();
      }
    }
  }
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  static constexpr std::int64_t kBlock = std::int64_t{1} << 20;
  void open_next() {
    const std::int64_t s = static_cast<std::int64_t>(paths_.size());
    end_ = (s + 1) * n_ / shards_;
    TokenShardMeta m = plan_.meta;
    m.shard_index = s;
    m.num_shards = shards_;
    paths_.push_back(plan_.out_dir + "/" + shard_file_name(name_, s, shards_));
    writer_ = std::make_unique<TokenShardWriter>(paths_.back(), m, plan_.deflate_level);
  }
  const std::int64_t n_;
  const TextShardPlan& plan_;
  const std::string name_;
  const std::int64_t shards_;
  std::int64_t at_ = 0, end_ = 0;
  std::vector<std::int32_t> block_;
  std::unique_ptr<TokenShardWriter> writer_;
  std::vector<std::string> paths_;
};

// Reads the chunks of every rank in chunk order and writes one set's shards.
std::vector<std::string> merge_set(const TextShardPlan& plan, int ranks, std::int64_t chunks,
                                   bool val, std::int64_t& tokens) {
  std::vector<std::vector<std::int64_t>> counts(static_cast<std::size_t>(ranks));
  std::vector<std::unique_ptr<Spill>> ids;
  tokens = 0;
  for (int r = 0; r < ranks; ++r) {
    Spill index(spill_path(plan, r, "index"), "rb");
    const std::int64_t mine = chunks / ranks + (r < chunks % ranks ? 1 : 0);
    std::vector<std::int64_t> both(static_cast<std::size_t>(2 * mine));
    index.read(both.data(), both.size());
    for (std::int64_t k = 0; k < mine; ++k) {
      counts[static_cast<std::size_t>(r)].push_back(both[static_cast<std::size_t>(2 * k + val)]);
      tokens += both[static_cast<std::size_t>(2 * k + val)];
    }
    ids.push_back(std::make_unique<Spill>(spill_path(plan, r, val ? "val" : "train"), "rb",
                                          plan.meta.token_bytes() == 2));
  }
  ShardSetWriter out(tokens, plan, val ? plan.val_name : plan.name,
                     val ? plan.val_shards : plan.shards);
  std::vector<std::int32_t> buf;
  for (std::int64_t c = 0; c < chunks; ++c) {
    const auto r = static_cast<std::size_t>(c % ranks);
    buf.resize(static_cast<std::size_t>(counts[r][static_cast<std::size_t>(c / ranks)]));
    ids[r]->read_ids(buf.data(), buf.size());
    out.push(buf);
  }
  return out.paths();
}

}  // namespace

TextShardResult shard_corpus(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                             const TextCorpusOptions& options, const TextShardPlan& plan, int rank,
                             int ranks, const std::function<void()>& barrier) {
  std::error_code ec;
  std::filesystem::create_directories(plan.out_dir, ec);
  // The spill files of every rank go once rank 0 has merged them, or on an error.
  struct Cleanup {
    std::vector<std::string> paths;
    ~Cleanup() {
      std::error_code ec;
      for (const auto& p : paths)
        std::filesystem::remove(p, ec);
    }
  } cleanup;
  for (const char* what : {"train", "val", "index"})
    cleanup.paths.push_back(spill_path(plan, rank, what));

  TextShardResult result;
  {
    const bool narrow = plan.meta.token_bytes() == 2;
    Spill train(spill_path(plan, rank, "train"), "wb", narrow);
    Spill val(spill_path(plan, rank, "val"), "wb", narrow);
    Spill index(spill_path(plan, rank, "index"), "wb");
    result.counts = encode_corpus(
        files, tokenizer, options, rank, ranks,
        [&](std::int64_t, std::span<const std::int32_t> t, std::span<const std::int32_t> v) {
          train.write_ids(t);
          val.write_ids(v);
          const std::int64_t n[2] = {static_cast<std::int64_t>(t.size()),
                                     static_cast<std::int64_t>(v.size())};
          index.write(n, 2);
        });
    train.close();
    val.close();
    index.close();
  }
  barrier();
  if (rank != 0) cleanup.paths.clear();  // rank 0 reads them now, and removes them
  if (rank == 0) {
    for (int r = 1; r < ranks; ++r)
      for (const char* what : {"train", "val", "index"})
        cleanup.paths.push_back(spill_path(plan, r, what));
    result.train_paths = merge_set(plan, ranks, result.counts.chunks, false, result.train_tokens);
    if (options.val_fraction > 0)
      result.val_paths = merge_set(plan, ranks, result.counts.chunks, true, result.val_tokens);
  }
  return result;
}

}  // namespace lockstep::data
