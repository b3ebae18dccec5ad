// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11): value i of stream s under
// seed k is a pure function of (k, s, i). Results never depend on thread count, the order in
// which threads ask, or on which device computes them; a stream is named, e.g. by hashing a
// parameter name, so adding a layer never shifts another layer's initial weights.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace lockstep {

class Philox {
 public:
  Philox(std::uint64_t seed, std::uint64_t stream) : seed_(seed), stream_(stream) {}

  // Four 32-bit words for block `counter`.
  std::array<std::uint32_t, 4> block(std::uint64_t counter) const;
  std::uint32_t u32(std::uint64_t i) const { return block(i / 4)[i % 4]; }
  // Uniform in [0, 1) with 24 random bits (exactly representable in float).
  float uniform(std::uint64_t i) const {
    return static_cast<float>(u32(i) >> 8) * (1.0f / 16777216.0f);
  }
  // Standard normal via Box-Muller on draws 2i and 2i+1.
  float normal(std::uint64_t i) const;
  // out[j] = uniform(first + j) scaled to [lo, hi).
  void fill_uniform(float* out, std::int64_t n, float lo, float hi, std::uint64_t first = 0) const;

  std::uint64_t seed() const { return seed_; }
  std::uint64_t stream() const { return stream_; }

 private:
  std::uint64_t seed_;
  std::uint64_t stream_;
};

// FNV-1a 64-bit: stable across platforms and runs (std::hash is not).
std::uint64_t hash_string(const std::string& text);
std::uint64_t hash_combine(std::uint64_t a, std::uint64_t b);

}  // namespace lockstep
