// Philox4x32-10 for host and device: the same rounds as lockstep::Philox (src/core/rng.cpp), in a
// form nvcc can inline into kernels. Dropout masks on the GPU equal the CPU's bit for bit because
// both call this function on (seed, stream, counter); tests/cuda checks it against Philox::block
// on the host, so a change to either side fails there first.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define LOCKSTEP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LOCKSTEP_HOST_DEVICE inline
#endif

namespace lockstep::ops::cuda {

struct PhiloxBlock {
  std::uint32_t v[4];
};

LOCKSTEP_HOST_DEVICE PhiloxBlock philox_block(std::uint64_t seed, std::uint64_t stream,
                                              std::uint64_t counter) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  std::uint32_t c0 = static_cast<std::uint32_t>(counter);
  std::uint32_t c1 = static_cast<std::uint32_t>(counter >> 32);
  std::uint32_t c2 = static_cast<std::uint32_t>(stream);
  std::uint32_t c3 = static_cast<std::uint32_t>(stream >> 32);
  std::uint32_t k0 = static_cast<std::uint32_t>(seed);
  std::uint32_t k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * c0;
    std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * c2;
    std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    std::uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

// Philox::uniform's mapping: 24 random bits, exactly representable in float.
LOCKSTEP_HOST_DEVICE float philox_uniform(std::uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

}  // namespace lockstep::ops::cuda
