// CPU side of the precision policy (ops/precision.hpp): f32 <-> bf16 conversion, the ISA check,
// and the bf16 GEMM. (bf16 convolutions are the oneDNN primitives of cpu_conv.cpp built with bf16
// inputs.)
//
// bf16 GEMM: oneDNN's matmul with bf16 operands and an f32 destination, alpha as an output scale
// and beta as a sum post-op, so dst = alpha * op(A) op(B) + beta * dst with f32 accumulation and
// nothing converted back. oneDNN dispatches to AMX tiles or AVX512-BF16 dot products (vdpbf16ps)
// by the CPU; one primitive per (shape, transposes, alpha, beta) is built once and cached, like the
// convolutions. Transposed operands are described with strides, so no operand is ever copied to
// transpose it. Operands are converted to bf16 per op, except the Context's reuse window's
// tensors (the parameters during a forward+backward), converted once per window (CastCache).
//
// Why neither AVX512-BF16 nor AMX means an error: oneDNN then emulates bf16 on AVX512 at about a
// quarter of its fp32 speed, and has no bf16 at all below AVX512 (docs/PERFORMANCE.md,
// "Precision").
//
// Conversion is round to nearest even with NaN kept NaN; where the CPU has AVX512-BF16 it is
// vcvtneps2bf16, which flushes f32 subnormals (below 1.2e-38) to zero, as oneDNN's kernels
// (vdpbf16ps) treat them anyway. The portable loop does the same, so results do not depend on
// which path ran.
#include <omp.h>

#include <array>
#include <bit>
#include <cstring>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "lockstep/core/bf16.hpp"
#include "lockstep/core/error.hpp"
#include "ops/cpu/bf16_rows.hpp"
#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/cpu_sgemm.hpp"
#include "ops/cpu/parallel.hpp"
#include "ops/cpu/simd.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LOCKSTEP_X86_BF16 1
#endif

namespace lockstep::ops::cpu {
namespace {

// Compiled for AVX2 and AVX-512F as well (integer bit operations only, so every clone gives the
// same bits): about 3x the baseline build's speed on an AVX2 CPU, where this is the only path
// (the gradients of dist.grad_dtype = bf16 go through it every step).
LOCKSTEP_SIMD_CLONES void to_bf16_portable(const float* src, std::uint16_t* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    dst[i] = float_to_bf16(src[i]);
}

#ifdef LOCKSTEP_X86_BF16
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void to_bf16_avx512(
    const float* src, std::uint16_t* dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256bh r = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)r);
  }
  if (i < n) {
    const auto mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m256bh r = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, src + i));
    _mm256_mask_storeu_epi16(dst + i, mask, (__m256i)r);
  }
}
#endif

void f32_to_bf16(ThreadPool& pool, const float* src, std::uint16_t* dst, std::int64_t n) {
  parallel_range(pool, n, kParallelGrain,
                 [&](std::int64_t b, std::int64_t e) { round_to_bf16(src + b, dst + b, e - b); });
}

void bf16_to_f32(ThreadPool& pool, const std::uint16_t* src, float* dst, std::int64_t n) {
  parallel_range(pool, n, kParallelGrain,
                 [&](std::int64_t b, std::int64_t e) { widen_bf16(src + b, dst + b, e - b); });
}

bool has_isa(dnnl::cpu_isa have, dnnl::cpu_isa want) {
  const auto h = static_cast<unsigned>(have), w = static_cast<unsigned>(want);
  return (h & w) == w;
}

// What oneDNN will dispatch to on this CPU (after ONEDNN_MAX_CPU_ISA, if set).
std::string isa_name() {
  using dnnl::cpu_isa;
  const cpu_isa isa = dnnl::get_effective_cpu_isa();
  if (has_isa(isa, cpu_isa::avx512_core_amx)) return "avx512_core_amx (AMX)";
  if (has_isa(isa, cpu_isa::avx512_core_bf16)) return "avx512_core_bf16 (AVX512-BF16, no AMX)";
  if (has_isa(isa, cpu_isa::avx512_core_vnni)) return "avx512_core_vnni (no AVX512-BF16, no AMX)";
  if (has_isa(isa, cpu_isa::avx512_core)) return "avx512_core (no AVX512-BF16, no AMX)";
  if (has_isa(isa, cpu_isa::avx2)) return "avx2 (no AVX512)";
  return "an ISA below avx2";
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return str("oneDNN ", v->major, ".", v->minor, ".", v->patch);
}

bool native_bf16() {
  return has_isa(dnnl::get_effective_cpu_isa(), dnnl::cpu_isa::avx512_core_bf16);
}

}  // namespace

void round_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n) {
#ifdef LOCKSTEP_X86_BF16
  static const bool avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  if (avx512_bf16) return to_bf16_avx512(src, dst, n);
#endif
  to_bf16_portable(src, dst, n);
}

void widen_bf16(const std::uint16_t* src, float* dst, std::int64_t n) {
  LOCKSTEP_IVDEP
  for (std::int64_t i = 0; i < n; ++i)
    dst[i] = bf16_to_float(src[i]);
}

float* thread_scratch(std::size_t n, int slot) {
  thread_local std::vector<float> buffers[4];
  std::vector<float>& b = buffers[static_cast<std::size_t>(slot) & 3u];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// One cached matmul: C[m, n] = alpha * op(A)[m, k] op(B)[k, n] (bf16) (+ bias[n]) + beta * C,
// with rows of lda and ldb elements (k and n, or m and k transposed, unless a longer row is read
// only up to k: ops::gemm_leading). C is f32, or a bf16 activation (beta 0) that oneDNN writes
// from its f32 accumulator plus the f32 bias, rounded once to nearest even: the bits of the f32 C,
// add_row_bias and cast (tests/ops/test_fused_ops.cpp), with no pass of its own.
struct Bf16Gemm {
  struct Prim {
    dnnl::matmul prim;
    dnnl::memory a, b, c, bias, scratchpad;
  };
  using Key = std::array<std::int64_t, 11>;

  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Prim> cache;

  Prim& get(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda,
            std::int64_t ldb, float alpha, float beta, bool c_bf16, bool bias) {
    const std::int64_t alpha_bits = std::bit_cast<std::int32_t>(alpha);
    const std::int64_t beta_bits = std::bit_cast<std::int32_t>(beta);
    const Key key{m, n, k, ta, tb, lda, ldb, alpha_bits, beta_bits, c_bf16, bias};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    using dnnl::memory;
    using Dt = memory::data_type;
    // Row-major operands; a transposed one is the same buffer read with swapped strides.
    memory::desc a({m, k}, Dt::bf16, ta ? memory::dims{1, lda} : memory::dims{lda, 1});
    memory::desc b({k, n}, Dt::bf16, tb ? memory::dims{1, ldb} : memory::dims{ldb, 1});
    memory::desc c({m, n}, c_bf16 ? Dt::bf16 : Dt::f32, memory::dims{n, 1});
    memory::desc bias_md({1, n}, Dt::f32, memory::dims{n, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {  // beta = 0 must overwrite C (even NaN), so no sum post-op then
      dnnl::post_ops po;
      po.append_sum(beta);
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(
        bias ? dnnl::matmul::desc(a, b, bias_md, c) : dnnl::matmul::desc(a, b, c), attr, engine);
    Prim p{dnnl::matmul(pd),
           memory(a, engine, nullptr),
           memory(b, engine, nullptr),
           memory(c, engine, nullptr),
           memory(bias_md, engine, nullptr),
           memory(pd.scratchpad_desc(), engine)};
    return cache.emplace(key, std::move(p)).first->second;
  }
};

void Bf16GemmDeleter::operator()(Bf16Gemm* g) const {
  delete g;
}

void CpuBackend::cast(const Tensor& src, Tensor& dst) {
  if (src.dtype() == DType::F32) {
    f32_to_bf16(ctx_.pool(), src.data<float>(), static_cast<std::uint16_t*>(dst.raw_data()),
                src.numel());
  } else {
    bf16_to_f32(ctx_.pool(), static_cast<const std::uint16_t*>(src.raw_data()), dst.data<float>(),
                src.numel());
  }
}

void CpuBackend::check_precision(Precision p) {
  if (p != Precision::BF16) return;  // fp32, and tf32 = fp32 here
  LOCKSTEP_CHECK_HINT(native_bf16(), "set train.precision = fp32 on this machine",
                      "train.precision = bf16 needs a CPU with AMX or AVX512-BF16, but ",
                      onednn_version(), " finds only ", isa_name(),
                      " on this one: it would emulate bf16 at about a quarter of its fp32 speed "
                      "(and not run it at all below AVX512)");
}

std::string CpuBackend::precision_info(Precision p) {
  switch (p) {
    case Precision::FP32:
      return "fp32: " + sgemm_description() + " and oneDNN f32 convolutions";
    case Precision::TF32:
      return "tf32 = fp32 on the CPU (no TF32 units): " + sgemm_description() +
             " and oneDNN f32 convolutions";
    case Precision::BF16:
      return "bf16 GEMMs and convolutions with f32 accumulation: " + onednn_version() + " on " +
             isa_name();
  }
  return "?";
}

void CpuBackend::gemm_bf16(bool trans_a, bool trans_b, std::int64_t k, float alpha, const Tensor& a,
                           const Tensor& b, float beta, Tensor& c, const Tensor& bias) {
  if (!bf16_) bf16_.reset(new Bf16Gemm);
  auto convert = [&](const Tensor& src, Tensor& dst) { cast(src, dst); };
  Tensor a16 = casts_.get(ctx_, a, 0, convert);
  Tensor b16 = casts_.get(ctx_, b, 1, convert);
  Bf16Gemm::Prim& p = bf16_->get(trans_a, trans_b, c.dim(0), c.dim(1), k, a.dim(1), b.dim(1), alpha,
                                 beta, c.dtype() == DType::BF16, bias.defined());
  p.a.set_data_handle(a16.raw_data());
  p.b.set_data_handle(b16.raw_data());
  p.c.set_data_handle(c.raw_data());
  std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, p.a},
                                                {DNNL_ARG_WEIGHTS, p.b},
                                                {DNNL_ARG_DST, p.c},
                                                {DNNL_ARG_SCRATCHPAD, p.scratchpad}};
  if (bias.defined()) {
    p.bias.set_data_handle(bias.raw_data());
    args.emplace(DNNL_ARG_BIAS, p.bias);
  }
  omp_set_num_threads(ctx_.threads());  // per calling thread: this Context's team (cpu_backend.cpp)
  p.prim.execute(bf16_->stream, args);
  bf16_->stream.wait();
}

// A bf16 y: the GEMM writes it (or pre_act) with the bias in oneDNN's epilogue, one pass where
// the composition makes three (the f32 product, the bias, the cast) with the same bits; the GELU
// then reads and writes bf16. An f32 y is the composition.
void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                                Tensor& y, Tensor& pre_act) {
  const std::int64_t m = x.dim(0), n = w.dim(0), k = w.dim(1);
  if (y.dtype() != DType::BF16 || m == 0 || n == 0 || k == 0) {
    Backend::linear_forward(x, w, b, act, y, pre_act);
    return;
  }
  Tensor& z = act == Activation::None ? y : pre_act;
  gemm_bf16(false, true, k, 1.0f, x, w, 0.0f, z, b);
  if (act == Activation::GeluTanh) gelu_tanh_forward(pre_act, y);
}

}  // namespace lockstep::ops::cpu
