// lockstep-shard: makes and inspects lockstep shard sets (docs/SHARD-FORMAT.md).
//   lockstep-shard idx --images=F --labels=F --out=DIR [--name=train] [--shards=N] [--deflate=L]
//   lockstep-shard csv --file=F --label-column=K --shape=1,28,28 --out=DIR [--name=train]
//                      [--dtype=f32|u8] [--classes=K] [--shards=N] [--deflate=L]
//   lockstep-shard fashion-mnist --out=DIR [--shards=N] [--source=DIR] [--deflate=L]
//   [mpirun -np N] lockstep-shard text --input=FILE... --out=DIR [--tokenizer=bytes|gpt2]
//                       [--name=train] [--shards=N] [--val-fraction=F] [--val-name=val]
//                       [--val-shards=N] [--documents=file|paragraph|line|record]
//                       [--jsonl-field=F] [--threads=N] [--memory=256MiB] [--progress]
//                       [--gpt2-dir=DIR] [--deflate=L] [--overwrite]
//   lockstep-shard tokenize FILE [--tokenizer=bytes|gpt2] [--gpt2-dir=DIR] [--whole-file]
//                           (ids of each line, or of the whole file)
//   lockstep-shard inspect PATH    (a shard, a folder, a glob or DIR/NAME; image or token shards)
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "image_commands.hpp"  // defines: cmd_images, cmd_cifar, kImageUsage
#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/comm/mpi_communicator.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/data/importers.hpp"
#include "lockstep/data/shard.hpp"
#include "lockstep/data/text_corpus.hpp"
#include "lockstep/data/token_dataset.hpp"
#include "lockstep/data/token_shard.hpp"
#include "lockstep/data/tokenizer.hpp"

using namespace lockstep;
using namespace lockstep::data;

namespace {

constexpr const char* kUsage =
    "usage:\n"
    "  lockstep-shard idx --images=F --labels=F --out=DIR [--name=train] [--shards=1] [--limit=N] "
    "[--deflate=0]\n"
    "  lockstep-shard csv --file=F --label-column=K --shape=C,H,W --out=DIR [--name=train]\n"
    "                     [--dtype=f32|u8] [--classes=K] [--shards=1] [--deflate=0]\n"
    "  lockstep-shard fashion-mnist --out=DIR [--shards=1] "
    "[--source=/usr/share/datasets/fashion-mnist]\n"
    "                     [--limit=N] [--test-limit=N]   (first N samples; 0 = all)\n"
    "                     [--deflate=0]\n"
    "  [mpirun -np N] lockstep-shard text --input=FILE [--input=FILE ...] --out=DIR\n"
    "                     [--tokenizer=bytes|gpt2] [--name=train] [--shards=1]\n"
    "                     [--val-fraction=0] [--val-name=val] [--val-shards=1]\n"
    "                     [--documents=file|paragraph|line|record] [--jsonl-field=FIELD]\n"
    "                     [--threads=1] [--memory=256MiB] [--progress[=0]] [--gpt2-dir=DIR]\n"
    "                     [--deflate=0] [--overwrite]\n"
    "                     (--input takes files, folders, quoted globs or - for stdin, plain,\n"
    "                     gzip or zstd; --jsonl-field=text reads JSON Lines, one document per\n"
    "                     record; the shards are the same for any --threads and ranks; --memory\n"
    "                     bounds the run's memory; --progress (default: when stderr is a\n"
    "                     terminal) prints MB/s, documents, tokens and an ETA; shards of the\n"
    "                     two names that this run would not replace are an error, or with\n"
    "                     --overwrite removed)\n"
    "  lockstep-shard tokenize FILE [--tokenizer=bytes|gpt2] [--gpt2-dir=DIR] [--whole-file]\n"
    "                     (prints the token ids of each line of FILE, '-' for stdin; with\n"
    "                     --whole-file, of the whole file, newlines included, on one line)\n"
    "  lockstep-shard inspect PATH   (a shard file, a folder, a glob, or DIR/NAME)\n";

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;           // the last value of each option
  std::map<std::string, std::vector<std::string>> all;  // every value, for repeatable options
  std::set<std::string> used;

  std::vector<std::string> get_all(const std::string& key) {
    used.insert(key);
    auto it = all.find(key);
    return it == all.end() ? std::vector<std::string>{} : it->second;
  }
  double get_double(const std::string& key, double fallback) {
    std::string v = get(key, "");
    if (v.empty()) return fallback;
    try {
      std::size_t pos = 0;
      double r = std::stod(v, &pos);
      if (pos == v.size()) return r;
    } catch (const std::exception&) {
    }
    LOCKSTEP_FAIL("--", key, "=", v, " is not a number");
  }

  std::string get(const std::string& key, const std::string& fallback) {
    used.insert(key);
    auto it = options.find(key);
    return it == options.end() ? fallback : it->second;
  }
  std::string need(const std::string& key) {
    used.insert(key);
    auto it = options.find(key);
    LOCKSTEP_CHECK_HINT(it != options.end() && !it->second.empty(), "see lockstep-shard --help",
                        "missing --", key, "=...");
    return it->second;
  }
  std::int64_t get_int(const std::string& key, std::int64_t fallback) {
    std::string v = get(key, "");
    if (v.empty()) return fallback;
    try {
      std::size_t pos = 0;
      long long r = std::stoll(v, &pos);
      if (pos == v.size()) return r;
    } catch (const std::exception&) {
    }
    LOCKSTEP_FAIL("--", key, "=", v, " is not an integer");
  }
  // Every option given must have been asked for: a typo is an error, not a silent default.
  void check_all_used() const {
    for (const auto& [k, v] : options) {
      LOCKSTEP_CHECK_HINT(used.count(k), "see lockstep-shard --help", "unknown option --", k);
    }
  }
};

ShardWriterOptions writer_options(Args& a) {
  ShardWriterOptions o;
  o.deflate_level = static_cast<int>(a.get_int("deflate", kDefaultDeflateLevel));
  return o;
}

Shape parse_shape(const std::string& text) {
  Shape s;
  std::size_t start = 0;
  for (;;) {
    std::size_t comma = text.find(',', start);
    std::string part =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    try {
      std::size_t pos = 0;
      long long d = std::stoll(part, &pos);
      LOCKSTEP_CHECK(pos == part.size() && d >= 1, "");
      s.push_back(d);
    } catch (const std::exception&) {
      LOCKSTEP_FAIL_HINT("e.g. --shape=1,28,28", "--shape=", text,
                         " is not a list of positive integers");
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return s;
}

void report_written(const std::vector<std::string>& paths, const LabeledArray& d,
                    const std::vector<float>& mean, const std::vector<float>& stddev) {
  std::fprintf(stderr, "wrote %zu shard(s), %lld samples of %s %s, %lld classes:\n", paths.size(),
               static_cast<long long>(d.x.dim(0)), dtype_name(d.x.dtype()),
               shape_str(Shape(d.x.shape().begin() + 1, d.x.shape().end())).c_str(),
               static_cast<long long>(d.num_classes));
  for (const auto& p : paths)
    std::fprintf(stderr, "  %s\n", p.c_str());
  for (std::size_t c = 0; c < mean.size() && c < 8; ++c)
    std::fprintf(stderr, "  channel %zu: mean %.6f std %.6f\n", c, mean[c], stddev[c]);
}

// --limit=N keeps the first N samples (0 = all): small real subsets for tests and smoke runs.
void apply_limit(LabeledArray& d, std::int64_t limit) {
  LOCKSTEP_CHECK(limit >= 0, "--limit must be >= 0, got ", limit);
  if (limit == 0 || limit >= d.x.dim(0)) return;
  d.x = d.x.slice(0, limit).clone();
  d.y.resize(static_cast<std::size_t>(limit));
}

int cmd_idx(Args& a) {
  LabeledArray d = read_idx_pair(a.need("images"), a.need("labels"));
  apply_limit(d, a.get_int("limit", 0));
  std::string out = a.need("out"), name = a.get("name", "train");
  std::int64_t shards = a.get_int("shards", 1);
  auto opts = writer_options(a);
  a.check_all_used();
  std::vector<float> mean, stddev;
  channel_stats(d.x, mean, stddev);
  report_written(write_shard_set(d, out, name, shards, mean, stddev, opts), d, mean, stddev);
  return 0;
}

int cmd_csv(Args& a) {
  CsvOptions o;
  std::string file = a.need("file");
  o.label_column = a.need("label-column");
  o.sample_shape = parse_shape(a.need("shape"));
  o.dtype = dtype_from_name(a.get("dtype", "f32"));
  o.num_classes = a.get_int("classes", 0);
  std::string out = a.need("out"), name = a.get("name", "train");
  std::int64_t shards = a.get_int("shards", 1);
  auto opts = writer_options(a);
  a.check_all_used();
  LabeledArray d = read_csv(file, o);
  std::vector<float> mean, stddev;
  if (d.x.ndim() >= 2) channel_stats(d.x, mean, stddev);
  report_written(write_shard_set(d, out, name, shards, mean, stddev, opts), d, mean, stddev);
  return 0;
}

int cmd_fashion_mnist(Args& a) {
  std::string src = a.get("source", "/usr/share/datasets/fashion-mnist");
  std::string out = a.need("out");
  std::int64_t shards = a.get_int("shards", 1);
  std::int64_t limit = a.get_int("limit", 0), test_limit = a.get_int("test-limit", 0);
  auto opts = writer_options(a);
  a.check_all_used();
  LabeledArray train =
      read_idx_pair(src + "/train-images-idx3-ubyte.gz", src + "/train-labels-idx1-ubyte.gz");
  LabeledArray test =
      read_idx_pair(src + "/t10k-images-idx3-ubyte.gz", src + "/t10k-labels-idx1-ubyte.gz");
  apply_limit(train, limit);
  apply_limit(test, test_limit);
  // Both sets are normalised with the training statistics: the test set must not inform them.
  std::vector<float> mean, stddev;
  channel_stats(train.x, mean, stddev);
  train.num_classes = test.num_classes = 10;
  report_written(write_shard_set(train, out, "train", shards, mean, stddev, opts), train, mean,
                 stddev);
  report_written(write_shard_set(test, out, "test", shards, mean, stddev, opts), test, mean,
                 stddev);
  return 0;
}

// The unigram entropy of a token set, printed so a trainer's validation loss has a baseline.
void print_token_stats(const TokenDataset& ds, const char* indent) {
  const auto counts = token_counts(ds);
  const double h = unigram_entropy(counts);
  const auto used = std::count_if(counts.begin(), counts.end(), [](auto c) { return c > 0; });
  std::printf("%sdocuments:       %lld (end-of-text tokens)\n", indent,
              static_cast<long long>(counts[static_cast<std::size_t>(ds.eot_token())]));
  std::printf("%sdistinct tokens: %lld of %lld\n", indent, static_cast<long long>(used),
              static_cast<long long>(ds.vocab_size()));
  std::printf(
      "%sunigram entropy: %.4f nats/token (perplexity %.2f): the loss of predicting "
      "each token by its frequency\n",
      indent, h, std::exp(h));
}

// --memory=256MiB: a byte count with a binary suffix (KiB, MiB, GiB, or K, M, G); a bare number
// is MiB, as the trainer's sizes are.
std::int64_t parse_memory(const std::string& text) {
  std::size_t pos = 0;
  long long n = -1;
  try {
    n = std::stoll(text, &pos);
  } catch (const std::exception&) {
  }
  const std::string unit = text.substr(std::min(pos, text.size()));
  int shift = -1;
  if (unit.empty() || unit == "M" || unit == "MiB") shift = 20;
  if (unit == "K" || unit == "KiB") shift = 10;
  if (unit == "G" || unit == "GiB") shift = 30;
  LOCKSTEP_CHECK_HINT(n > 0 && shift >= 0 && n < (1LL << (62 - shift)), "e.g. --memory=256MiB",
                      "--memory=", text, " is not a size (a number and KiB, MiB or GiB)");
  return static_cast<std::int64_t>(n) << shift;
}

// Text inputs, streamed and encoded by --threads threads in each of the job's ranks (mpirun -np
// N lockstep-shard text ...; one process without mpirun), with the same shards whatever the
// threads and ranks (Note [Text determinism] in data/text_corpus.hpp).
int cmd_text(Args& a, int rank, int ranks, const std::function<void()>& barrier) {
  const auto files = expand_text_inputs(a.get_all("input"));
  const std::string tokenizer_name = a.get("tokenizer", "bytes");
  const std::string gpt2_dir = a.get("gpt2-dir", "");
  TextShardPlan plan;
  plan.out_dir = a.need("out");
  plan.name = a.get("name", "train");
  plan.val_name = a.get("val-name", "val");
  plan.shards = a.get_int("shards", 1);
  plan.val_shards = a.get_int("val-shards", 1);
  TextCorpusOptions options;
  options.val_fraction = a.get_double("val-fraction", 0);
  options.jsonl_field = a.get("jsonl-field", "");
  options.documents =
      document_split_from_name(a.get("documents", options.jsonl_field.empty() ? "file" : "record"));
  LOCKSTEP_CHECK_HINT(options.jsonl_field.empty() == (options.documents != DocumentSplit::Record),
                      "--jsonl-field=F reads JSON Lines, one document per record",
                      options.jsonl_field.empty() ? "--documents=record needs --jsonl-field"
                                                  : "--jsonl-field is only for JSON Lines records");
  options.threads = static_cast<int>(a.get_int("threads", 1));
  options.memory_bytes = parse_memory(a.get("memory", "256MiB"));
  const std::string progress = a.get("progress", "auto");
  LOCKSTEP_CHECK_HINT(progress == "auto" || progress == "1" || progress == "0",
                      "--progress, --progress=0 or leave it out", "--progress=", progress);
  options.progress = rank == 0 && (progress == "1" || (progress == "auto" && isatty(2)));
  plan.deflate_level = static_cast<int>(a.get_int("deflate", kDefaultDeflateLevel));
  const bool overwrite = a.get("overwrite", "0") == "1";
  a.check_all_used();
  const std::string& out = plan.out_dir;
  const std::string &name = plan.name, &val_name = plan.val_name;
  LOCKSTEP_CHECK_HINT(options.val_fraction == 0 || val_name != name, "give another --val-name",
                      "--val-name=", val_name, " is the name of the training split");
  // Shards of an earlier run into the same folder that this run would not overwrite (another
  // shard count, or a validation split this run does not make) would be read with the new ones
  // by DIR and DIR/NAME: refused before any work, or with --overwrite removed once the new set
  // is written.
  std::vector<std::string> planned;
  for (std::int64_t s = 0; s < plan.shards; ++s)
    planned.push_back(shard_file_name(name, s, plan.shards));
  for (std::int64_t s = 0; options.val_fraction > 0 && s < plan.val_shards; ++s)
    planned.push_back(shard_file_name(val_name, s, plan.val_shards));
  const auto stale = stale_shard_files(out, {name, val_name}, planned);
  if (!stale.empty() && !overwrite) {
    std::string list;
    for (const auto& f : stale)
      list += (list.empty() ? "" : ", ") + f;
    LOCKSTEP_FAIL_HINT("remove them, or pass --overwrite to have them removed", "--out=", out,
                       " holds ", stale.size(), " shard file(s) of an earlier run that this run ",
                       "would not replace, which readers of the folder would mix with the new ",
                       "ones: ", list);
  }

  auto tokenizer = make_tokenizer(tokenizer_name, gpt2_dir);
  plan.meta.tokenizer = tokenizer->name();
  plan.meta.vocab_size = tokenizer->vocab_size();
  plan.meta.eot_token = tokenizer->eot_token();
  const TextShardResult r = shard_corpus(files, *tokenizer, options, plan, rank, ranks, barrier);
  if (rank != 0) return 0;
  const auto& meta = plan.meta;
  std::printf(
      "read %zu file(s), %lld bytes of text in %lld documents; tokenizer %s "
      "(vocabulary %lld, end-of-text %lld)\n",
      files.size(), static_cast<long long>(r.counts.text_bytes),
      static_cast<long long>(r.counts.train_documents + r.counts.val_documents),
      meta.tokenizer.c_str(), static_cast<long long>(meta.vocab_size),
      static_cast<long long>(meta.eot_token));
  auto report = [&](const std::vector<std::string>& paths, const std::string& set,
                    std::int64_t tokens, std::int64_t docs) {
    std::printf("%s: %lld tokens, %lld documents, %zu shard(s) in %s\n", set.c_str(),
                static_cast<long long>(tokens), static_cast<long long>(docs), paths.size(),
                out.c_str());
    auto ds = TokenDataset::open(paths, 1, 0);  // on demand: a set of any size, in bounded memory
    print_token_stats(*ds, "  ");
  };
  report(r.train_paths, name, r.train_tokens, r.counts.train_documents);
  if (options.val_fraction > 0) report(r.val_paths, val_name, r.val_tokens, r.counts.val_documents);
  for (const auto& f : stale) {
    std::error_code ec;
    LOCKSTEP_CHECK(std::filesystem::remove(f, ec) || !ec, "cannot remove ", f, ": ", ec.message());
    std::printf("removed %s (--overwrite: a shard of an earlier run)\n", f.c_str());
  }
  return 0;
}

// One line of ids per line of text (its newline excluded), or with --whole-file one line of the
// ids of the whole text, newlines included: to see how a tokenizer cuts text, and what
// tests/scripts/gpt2_reference.sh compares with tiktoken.
int cmd_tokenize(Args& a) {
  const std::string name = a.get("tokenizer", "bytes"), gpt2_dir = a.get("gpt2-dir", "");
  const bool whole_file = a.get("whole-file", "0") == "1";
  a.check_all_used();
  LOCKSTEP_CHECK_HINT(a.positional.size() == 1, "lockstep-shard tokenize FILE",
                      "tokenize takes one file");
  auto tokenizer = make_tokenizer(name, gpt2_dir);
  const std::string& path = a.positional[0];
  std::ifstream file;
  if (path != "-") {
    file.open(path, std::ios::binary);
    LOCKSTEP_CHECK(file.good(), "cannot read ", path);
  }
  std::istream& in = path == "-" ? std::cin : file;
  std::string line, out;
  std::vector<std::int32_t> ids;
  if (whole_file) {
    std::ostringstream text;
    text << in.rdbuf();
    try {
      tokenizer->encode(text.str(), ids);
    } catch (const Error& e) {
      LOCKSTEP_FAIL_HINT(e.hint(), path, ": ", e.message());
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ' ';
      out += std::to_string(ids[i]);
    }
    std::puts(out.c_str());
    return 0;
  }
  for (std::int64_t n = 1; std::getline(in, line); ++n) {
    ids.clear();
    try {
      tokenizer->encode(line, ids);
    } catch (const Error& e) {
      LOCKSTEP_FAIL_HINT(e.hint(), path, ", line ", n, ": ", e.message());
    }
    out.clear();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ' ';  // appended apart: GCC 12 warns falsely on "lit" + std::string&&
      out += std::to_string(ids[i]);
    }
    std::puts(out.c_str());
  }
  return 0;
}

int cmd_inspect_tokens(const std::string& spec) {
  auto ds = TokenDataset::open(spec, 1, 0);  // on demand: the preview reads only its tokens
  auto sizes = ds->shard_sizes();
  std::printf("set:             %s\n", spec.c_str());
  std::printf("kind:            tokens\n");
  std::printf("shards:          %zu\n", ds->files().size());
  for (std::size_t s = 0; s < sizes.size(); ++s)
    std::printf("  %-60s %lld tokens\n", ds->files()[s].c_str(), static_cast<long long>(sizes[s]));
  std::printf("tokens:          %lld\n", static_cast<long long>(ds->num_tokens()));
  std::printf("tokenizer:       %s\n", ds->tokenizer().c_str());
  std::printf("vocabulary:      %lld (stored as uint%d)\n",
              static_cast<long long>(ds->vocab_size()), ds->vocab_size() <= 65536 ? 16 : 32);
  std::printf("end-of-text:     %d\n", ds->eot_token());
  print_token_stats(*ds, "");
  const std::int64_t n = std::min<std::int64_t>(ds->num_tokens(), 64);
  std::vector<std::int32_t> head(static_cast<std::size_t>(n));
  ds->read_tokens(0, n, head.data());
  std::printf("first %lld ids: ", static_cast<long long>(n));
  for (auto id : head)
    std::printf(" %d", id);
  std::printf("\n");
  try {
    const std::string text = make_tokenizer(ds->tokenizer())->decode(head);
    std::string shown;  // control characters (the bytes tokenizer's end-of-text is NUL) escaped
    for (unsigned char c : text) {
      if (c == '\n')
        shown += "\\n";
      else if (c < 0x20 || c == 0x7f)
        shown += str("\\x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
      else
        shown += static_cast<char>(c);
    }
    std::printf("decoded:         %s\n", shown.c_str());
  } catch (const Error& e) {
    std::printf("decoded:         (cannot decode: %s)\n", e.message().c_str());
  }
  return 0;
}

int cmd_inspect(Args& a) {
  a.check_all_used();
  LOCKSTEP_CHECK_HINT(a.positional.size() == 1, "lockstep-shard inspect PATH",
                      "inspect takes one path");
  if (is_token_shard(resolve_shard_files(a.positional[0]).front()))
    return cmd_inspect_tokens(a.positional[0]);
  auto ds = ShardedDataset::open(a.positional[0], 0);  // on demand: reads labels only
  auto sizes = ds->shard_sizes();
  std::printf("set:          %s\n", a.positional[0].c_str());
  std::printf("shards:       %zu\n", ds->files().size());
  for (std::size_t s = 0; s < sizes.size(); ++s)
    std::printf("  %-60s %lld samples\n", ds->files()[s].c_str(), static_cast<long long>(sizes[s]));
  std::printf("samples:      %lld\n", static_cast<long long>(ds->size()));
  std::printf("sample shape: %s\n", shape_str(ds->sample_shape()).c_str());
  std::printf("dtype:        %s\n", dtype_name(ds->dtype()));
  if (ds->storage() == data::SampleStorage::Encoded)
    std::printf(
        "storage:      encoded (JPEG/PNG bytes, decoded by the loader to the shape above)\n");
  std::printf("classes:      %lld\n", static_cast<long long>(ds->num_classes()));
  if (!ds->mean().empty()) {
    for (std::size_t c = 0; c < ds->mean().size() && c < 8; ++c)
      std::printf("channel %zu:    mean %.6f std %.6f\n", c, ds->mean()[c], ds->stddev()[c]);
  } else {
    std::printf("mean/std:     not stored\n");
  }
  std::vector<std::int64_t> count(static_cast<std::size_t>(ds->num_classes()), 0);
  for (auto y : ds->labels())
    ++count[static_cast<std::size_t>(y)];
  std::printf("class balance:\n");
  for (std::size_t k = 0; k < count.size(); ++k)
    std::printf("  %4zu: %8lld  (%5.2f%%)\n", k, static_cast<long long>(count[k]),
                100.0 * static_cast<double>(count[k]) / static_cast<double>(ds->size()));
  return 0;
}

// `text` under mpirun or srun runs as one rank of the job; alone, as a job of one, without MPI.
int text_job(int argc, char** argv, Args& args) {
  if (comm::LaunchInfo::from_environment().launcher == "singleton")
    return cmd_text(args, 0, 1, [] {});
  comm::MpiSession session(&argc, &argv);
  return comm::run_or_abort([&] {
    // The barrier waits for the slowest rank's whole share of the corpus: no collective timeout.
    auto comm = comm::make_mpi_communicator(session, {.timeout_s = 1e9});
    return cmd_text(args, session.rank(), session.size(), [&] { comm->barrier(); });
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    std::fputs(shard_app::kImageUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  Args args;
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) == 0) {
      const std::string_view body = std::string_view(s).substr(2);
      const auto eq = body.find('=');
      std::string key(body.substr(0, eq));
      std::string value = eq == std::string_view::npos ? "1" : std::string(body.substr(eq + 1));
      args.all[key].push_back(value);
      args.options.insert_or_assign(std::move(key), std::move(value));
    } else {
      args.positional.push_back(s);
    }
  }
  try {
    if (cmd == "idx") return cmd_idx(args);
    if (cmd == "csv") return cmd_csv(args);
    if (cmd == "fashion-mnist") return cmd_fashion_mnist(args);
    if (cmd == "text") return text_job(argc, argv, args);
    if (cmd == "tokenize") return cmd_tokenize(args);
    if (cmd == "inspect") return cmd_inspect(args);
    if (cmd == "images") return shard_app::cmd_images(shard_app::Options(args.options));
    if (cmd == "cifar") return shard_app::cmd_cifar(shard_app::Options(args.options));
    std::fprintf(stderr, "lockstep-shard: unknown command '%s'\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep-shard %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
