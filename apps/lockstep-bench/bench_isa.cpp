// lockstep-bench isa: the per-core arithmetic peak of this CPU for fp32 and for bf16, which bounds
// what the bf16 policy can gain here: AVX512 fp32 FMAs (vfmadd231ps, 32 flops per instruction)
// against AVX512-BF16 dot products (vdpbf16ps, 64 flops per instruction), each in a loop of 24
// independent accumulators so that throughput, not latency, is measured. (AMX tiles are a
// separate unit that oneDNN uses where the CPU has it; this measures the AVX512 path only.)
// One thread; the figure is the median of --reps repetitions of about --min-ms each.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.hpp"
#include "lockstep/core/error.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LOCKSTEP_BENCH_X86 1
#endif

namespace lockstep::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kAcc = 24;

#ifdef LOCKSTEP_BENCH_X86
// Returns a value derived from the accumulators, so the loop cannot be optimised away.
__attribute__((target("avx512f"))) float fma_loop(long iters) {
  __m512 acc[kAcc];
  for (auto& a : acc)
    a = _mm512_setzero_ps();
  const __m512 x = _mm512_set1_ps(1e-8f), y = _mm512_set1_ps(1.0f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int j = 0; j < kAcc; ++j)
      acc[j] = _mm512_fmadd_ps(x, y, acc[j]);
  }
  __m512 total = _mm512_setzero_ps();
  for (auto& a : acc)
    total = _mm512_add_ps(total, a);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  float s = 0;
  for (float v : lanes)
    s += v;
  return s;
}

__attribute__((target("avx512f,avx512bf16"))) float dpbf16_loop(long iters) {
  __m512 acc[kAcc];
  for (auto& a : acc)
    a = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3200), y = (__m512bh)_mm512_set1_epi16(0x3f80);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int j = 0; j < kAcc; ++j)
      acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
  }
  __m512 total = _mm512_setzero_ps();
  for (auto& a : acc)
    total = _mm512_add_ps(total, a);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  float s = 0;
  for (float v : lanes)
    s += v;
  return s;
}
#endif

// GFLOP/s of loop(iters) doing flops_per_iter each: median over reps of ~min_ms runs.
template <class Loop>
double gflops(Loop loop, double flops_per_iter, int reps, double min_ms, float& sink) {
  long iters = 1000;
  for (;;) {  // calibrate to about min_ms
    auto t0 = Clock::now();
    sink += loop(iters);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s * 1e3 >= min_ms / 4) {
      iters = std::max(1L, static_cast<long>(iters * min_ms * 1e-3 / s));
      break;
    }
    iters *= 4;
  }
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    sink += loop(iters);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    rates.push_back(flops_per_iter * static_cast<double>(iters) / s * 1e-9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

int run(const Args& args) {
  const int reps = static_cast<int>(args.get_int("reps", 5));
  const double min_ms = args.get_double("min-ms", 200.0);
  LOCKSTEP_CHECK(reps >= 1 && min_ms > 0, "--reps and --min-ms must be positive");
  double fp32 = 0, bf16 = 0;
  float sink = 0;
#ifdef LOCKSTEP_BENCH_X86
  const bool has_avx512 = __builtin_cpu_supports("avx512f");
  const bool has_bf16 = __builtin_cpu_supports("avx512bf16");
  if (has_avx512) fp32 = gflops(fma_loop, kAcc * 32.0, reps, min_ms, sink);
  if (has_bf16) bf16 = gflops(dpbf16_loop, kAcc * 64.0, reps, min_ms, sink);
#else
  const bool has_avx512 = false, has_bf16 = false;
#endif
  std::fprintf(stderr,
               "isa: one core, AVX512 fp32 FMA %.1f GFLOP/s, AVX512-BF16 dot product %.1f GFLOP/s "
               "(bf16/fp32 %.2f)%s\n",
               fp32, bf16, fp32 > 0 ? bf16 / fp32 : 0.0,
               has_bf16 ? "" : (has_avx512 ? "; no AVX512-BF16" : "; no AVX512"));
  write_output(args, str("{\"benchmark\": \"isa\", \"machine\": ", machine_json(),
                         ", \"avx512_fp32_fma_gflops\": ", fp32, ", \"avx512_bf16_dot_gflops\": ",
                         bf16, ", \"bf16_over_fp32\": ", fp32 > 0 ? bf16 / fp32 : 0.0, "}\n"));
  __asm__ volatile("" : : "g"(sink) : "memory");  // the loops' results must look used
  return 0;
}

}  // namespace

LOCKSTEP_BENCH("isa",
               "one core's AVX512 fp32 FMA vs AVX512-BF16 dot-product peak (--reps=5 --min-ms=200)",
               "avx512f min-ms reps", run);

}  // namespace lockstep::bench
