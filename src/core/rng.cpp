#include "lockstep/core/rng.hpp"

#include <cmath>

namespace lockstep {
namespace {
constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

inline void mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}
}  // namespace

std::array<std::uint32_t, 4> Philox::block(std::uint64_t counter) const {
  std::uint32_t c0 = static_cast<std::uint32_t>(counter),
                c1 = static_cast<std::uint32_t>(counter >> 32);
  std::uint32_t c2 = static_cast<std::uint32_t>(stream_),
                c3 = static_cast<std::uint32_t>(stream_ >> 32);
  std::uint32_t k0 = static_cast<std::uint32_t>(seed_),
                k1 = static_cast<std::uint32_t>(seed_ >> 32);
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c0, hi0, lo0);
    mulhilo(kMul1, c2, hi1, lo1);
    std::uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c0, c1, c2, c3};
}

float Philox::normal(std::uint64_t i) const {
  auto b = block(i);
  // (0, 1] for the log, [0, 1) for the angle.
  double u1 = (static_cast<double>(b[0]) + 1.0) / 4294967296.0;
  double u2 = static_cast<double>(b[1]) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void Philox::fill_uniform(float* out, std::int64_t n, float lo, float hi,
                          std::uint64_t first) const {
  for (std::int64_t j = 0; j < n; ++j)
    out[j] = lo + (hi - lo) * uniform(first + static_cast<std::uint64_t>(j));
}

std::uint64_t hash_string(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::uint64_t hash_combine(std::uint64_t a, std::uint64_t b) {
  // splitmix64 finaliser over the pair.
  std::uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace lockstep
