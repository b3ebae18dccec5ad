// lockstep-shard's image importers, beside main.cpp's: `images` (an ImageFolder or a list of
// JPEG/PNG files, converted under MPI) and `cifar` (the CIFAR-10/100 binary format).
// docs/IMAGES.md describes both.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "lockstep/core/error.hpp"

namespace lockstep::shard_app {

inline constexpr const char* kImageUsage =
    "  lockstep-shard images (--root=DIR | --list=FILE [--base=DIR] [--classes=K]) --out=DIR\n"
    "                     --resize=S [--fit=crop|pad] [--store=raw|encoded] [--name=train]\n"
    "                     [--shards=N] [--train-set=DIR/train] [--skip-bad] [--threads=T]\n"
    "                     [--deflate=0] [--jpeg-restarts=1]  (JPEG/PNG to u8 [3,S,S];\n"
    "                     --store=encoded keeps the files for the loader to decode and crop,\n"
    "                     JPEGs re-encoded losslessly with restart markers unless\n"
    "                     --jpeg-restarts=0; under mpirun each rank converts whole shards,\n"
    "                     the same for any number of ranks)\n"
    "  lockstep-shard cifar --source=DIR --out=DIR [--labels=fine|coarse] [--shards=1]\n"
    "                     [--deflate=0]   (cifar-10-batches-bin or cifar-100-binary)\n";

// The --key=value options of one command (a bare --flag is "1"); a key no one asked for is an
// error, so a typo never falls back to a default silently.
class Options {
 public:
  explicit Options(std::map<std::string, std::string> values) : values_(std::move(values)) {}
  std::string get(const std::string& key, const std::string& fallback = "") {
    used_.insert(key);
    auto it = values_.find(key);
    return it == values_.end() ? fallback : it->second;
  }
  bool has(const std::string& key) {
    used_.insert(key);
    return values_.count(key) > 0;
  }
  std::string need(const std::string& key) {
    const std::string v = get(key);
    LOCKSTEP_CHECK_HINT(!v.empty(), "see lockstep-shard --help", "missing --", key, "=...");
    return v;
  }
  std::int64_t get_int(const std::string& key, std::int64_t fallback) {
    const std::string v = get(key);
    if (v.empty()) return fallback;
    std::size_t pos = 0;
    long long r = 0;
    try {
      r = std::stoll(v, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    LOCKSTEP_CHECK(pos == v.size() && pos > 0, "--", key, "=", v, " is not an integer");
    return r;
  }
  void check_all_used() const {
    for (const auto& [k, v] : values_)
      LOCKSTEP_CHECK_HINT(used_.count(k), "see lockstep-shard --help", "unknown option --", k);
  }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> used_;
};

int cmd_images(Options options);
int cmd_cifar(Options options);

}  // namespace lockstep::shard_app
