// CPU convolution through oneDNN (pooling is own loops: cpu_pool.cpp). Each distinct
// (op, shape, params, layout, precision) gets its primitive descriptor, argument map and reorders
// built once and cached in this backend, i.e. per Context: two Contexts never share a cache and
// need no lock.
// Layouts (measured, docs/PERFORMANCE.md):
// - NHWC activations (Conv2dParams::layout, a channels-last model): the primitives take src/dst
//   in NHWC, so the AMX and AVX-512 "brgconv" kernels read and write lockstep's tensors as they
//   are, with no transposing reorder (in bf16 only the f32 -> bf16 conversion, in the same order).
//   Forcing nhwc (rather than letting oneDNN pick with "any") measured fastest or even on
//   ResNet-50's shapes; oneDNN picks for weights.
// - NCHW activations: oneDNN picks (format "any": blocked nChw16c/OIhw16i16o on AVX-512) for
//   backward-weights always and for forward/backward-data when the input has at least
//   kBlockedMinChannels channels; with plain NCHW it falls back to im2col+gemm kernels that were
//   1.5-2x slower there and 25x slower for 1-channel backward-weights. For inputs with few
//   channels (the first layer) plain NCHW forward/backward-data was 1-2x / 2.5-5x faster, the
//   reorders costing more than the blocked kernel saves. Each call reorders into and out of the
//   chosen layout where it differs. LOCKSTEP_ONEDNN_PLAIN=1 in the environment forces plain
//   layouts, for that comparison.
// Memory: the reordered copies, oneDNN's scratchpads and the weight-gradient outputs of every
// cached primitive live in one arena per backend, sized to the largest single call, since calls
// never overlap: a ResNet-50 holds one such set instead of one per convolution and direction.
// Parameter gradients accumulate (dw += ...): oneDNN writes its weight/bias gradients into the
// arena, which are then added into dw/db.
// Precision bf16 (ops/precision.hpp): the same primitives with bf16 inputs (src, weights,
// diff_dst) and f32 outputs (dst, diff_src, diff_weights, bias), accumulating in f32; the input
// reorders above then also convert f32 -> bf16, so a bf16 convolution costs no extra pass, and an
// input already in bf16 (a layer that passes the same activation to two ops rounds it once)
// needs none at all in NHWC. The forward's dst is bf16 where the caller passes a bf16 y (a
// convolution feeding a BatchNorm, ops.hpp: bf16_conv_bn_activations): the kernel rounds its f32
// accumulators as it stores them. The weights are converted per call: convolution weights are small
// next to the activations (18K elements against 1.6M for fashion_cnn's second layer at batch 256).
#include <omp.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "lockstep/core/error.hpp"
#include "ops/cpu/bf16_rows.hpp"
#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/parallel.hpp"

namespace lockstep::ops::cpu {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;
using Key = std::array<std::int64_t, 16>;

enum class PrimKind : std::int64_t { ConvFwd, ConvBwdData, ConvBwdWeights };

bool force_plain_layout() {
  static const bool plain = [] {
    const char* v = std::getenv("LOCKSTEP_ONEDNN_PLAIN");
    return v && std::strcmp(v, "0") != 0 && *v;
  }();
  return plain;
}

// Where a buffer of a cached primitive lives: [offset, offset + bytes) of the backend's arena.
struct ArenaSlot {
  memory mem;  // handle set to the arena before every execution
  std::size_t offset = 0;
};

// One tensor argument of a primitive: `user` wraps the lockstep tensor (its layout, data handle
// set per call, or an arena slot for the weight-gradient outputs); when the primitive wants
// another layout, `inner` is an arena slot in that layout and `reorder` converts between them
// (before the primitive for inputs, after it for outputs).
struct Port {
  int arg = 0;
  bool output = false;
  memory user;
  bool user_in_arena = false;
  std::size_t user_offset = 0;
  ArenaSlot inner;
  dnnl::reorder reorder;
  bool reordered = false;
};

struct Prim {
  dnnl::primitive prim;
  std::vector<Port> ports;
  std::unordered_map<int, memory> args;
  ArenaSlot scratchpad;            // so execution never allocates
  memory diff_weights, diff_bias;  // plain outputs of backward-weights (arena), added into dw/db
  std::size_t arena_bytes = 0;     // this primitive's share of the arena, all slots together
};

memory::desc plain(const memory::dims& d, Tag tag, Dt dt = Dt::f32) {
  return memory::desc(d, dt, tag);
}
// A tensor's element type for oneDNN (f32, or bf16 for bf16 activation inputs).
Dt dt_of(const Tensor& t) {
  return t.dtype() == DType::BF16 ? Dt::bf16 : Dt::f32;
}
// Below this many input channels NCHW forward and backward-data use plain NCHW (see the top).
constexpr std::int64_t kBlockedMinChannels = 8;

// lockstep's tag for an activation tensor.
Tag user_tag(ImageLayout layout) {
  return layout == ImageLayout::NHWC ? Tag::nhwc : Tag::nchw;
}
// The primitive's descriptor for an activation (see the top): nhwc as it is, or for NCHW the
// blocked layout oneDNN picks or plain nchw.
memory::desc activation(const memory::dims& d, ImageLayout layout, bool blocked, Dt dt = Dt::f32) {
  if (layout == ImageLayout::NHWC) return memory::desc(d, dt, Tag::nhwc);
  return memory::desc(d, dt, blocked && !force_plain_layout() ? Tag::any : Tag::nchw);
}
memory::desc weights(const memory::dims& d, ImageLayout layout, bool blocked, Dt dt = Dt::f32) {
  const bool any = layout == ImageLayout::NHWC || (blocked && !force_plain_layout());
  return memory::desc(d, dt, any ? Tag::any : Tag::oihw);
}

// A 1x1, stride-1, unpadded convolution on channels-last activations is a GEMM over the
// [N*H*W, C] rows, a linear layer applied at every pixel: its weight gradient is dy^T x and its
// input gradient dy w. On ResNet-50's 1x1 shapes (bf16, 2 threads, batch 16) oneDNN 2.6.3's
// backward-weights kernel ran 1.3-9.7x and its backward-data kernel 1.2-3.4x slower than its
// matmul, so both take gemm; the forward stays on the convolution (its brgconv_1x1 kernel was
// as fast or faster: 0.7-2.2x the matmul's time). LOCKSTEP_POINTWISE_GEMM=0 in the environment
// keeps them all on the convolution primitives, for that comparison (docs/PERFORMANCE.md). In
// fp32 the same change made the step 1.16-1.30x slower (the f32 convolution kernels hold up, the
// sgemm split over two threads does not), so fp32 keeps the primitives.
// A strided one (ResNet's downsampling shortcuts) reads only the pixels (stride_h i, stride_w j):
// the same GEMMs over those rows, gathered for backward-weights and scattered, with zeros between,
// for backward-data. On ResNet-50's three strided shortcuts (bf16, 2 threads, batch 16) oneDNN
// 2.6.3's kernels took 3.6-6.3x (backward-weights) and 4.3-5.1x (backward-data) the matmuls' time,
// 113 against 25 ms a step (docs/PERFORMANCE.md); the gather and scatter are a copy of the pixels.
bool pointwise_as_gemm(Precision precision, const Shape& w, const Conv2dParams& p) {
  static const bool enabled = [] {
    const char* v = std::getenv("LOCKSTEP_POINTWISE_GEMM");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled && precision == Precision::BF16 && p.layout == ImageLayout::NHWC && w[2] == 1 &&
         w[3] == 1 && p.pad_h == 0 && p.pad_w == 0;
}

// The pixels a strided 1x1 convolution reads, x[n, sh i, sw j, :] of the NHWC x, as the rows of
// the bf16 `rows` [N*Ho*Wo, C] (rounded to bf16 when x is f32, as the GEMM would round them).
void gather_strided_pixels(ThreadPool& pool, const Tensor& x, const Conv2dParams& p,
                           std::int64_t ho, std::int64_t wo, Tensor& rows) {
  const std::int64_t h = x.dim(2), w = x.dim(3), c = x.dim(1);
  const bool x16 = x.dtype() == DType::BF16;
  const std::size_t elem = x16 ? 2 : 4;
  const auto* src = static_cast<const std::byte*>(x.raw_data());
  auto* dst = static_cast<std::uint16_t*>(rows.raw_data());
  parallel_range(pool, x.dim(0) * ho, std::max<std::int64_t>(1, kParallelGrain / (wo * c)),
                 [&](std::int64_t b, std::int64_t e) {
                   for (std::int64_t r = b; r < e; ++r) {
                     const std::int64_t n = r / ho, i = r % ho;
                     const std::byte* line = src + ((n * h + i * p.stride_h) * w * c) * elem;
                     for (std::int64_t j = 0; j < wo; ++j) {
                       const std::byte* px = line + j * p.stride_w * c * elem;
                       std::uint16_t* out = dst + (r * wo + j) * c;
                       if (x16) {
                         std::memcpy(out, px, static_cast<std::size_t>(c) * 2);
                       } else {
                         round_to_bf16(reinterpret_cast<const float*>(px), out, c);
                       }
                     }
                   }
                 });
}

// dx[n, y, x, :] = rows[n, y / sh, x / sw, :] where sh divides y and sw divides x, else 0: the
// input gradient of a strided 1x1 convolution from the GEMM's [N*Ho*Wo, C] rows (NHWC dx, f32).
void scatter_strided_pixels(ThreadPool& pool, const float* rows, const Conv2dParams& p,
                            std::int64_t ho, std::int64_t wo, Tensor& dx) {
  const std::int64_t h = dx.dim(2), w = dx.dim(3), c = dx.dim(1);
  float* out = dx.data<float>();
  parallel_range(pool, dx.dim(0) * h, std::max<std::int64_t>(1, kParallelGrain / (w * c)),
                 [&](std::int64_t b, std::int64_t e) {
                   for (std::int64_t r = b; r < e; ++r) {
                     const std::int64_t n = r / h, y = r % h;
                     float* line = out + r * w * c;
                     const bool sampled = y % p.stride_h == 0 && y / p.stride_h < ho;
                     for (std::int64_t x = 0; x < w; ++x) {
                       float* px = line + x * c;
                       if (sampled && x % p.stride_w == 0 && x / p.stride_w < wo) {
                         const std::int64_t row = (n * ho + y / p.stride_h) * wo + x / p.stride_w;
                         std::memcpy(px, rows + row * c, static_cast<std::size_t>(c) * 4);
                       } else {
                         std::memset(px, 0, static_cast<std::size_t>(c) * 4);
                       }
                     }
                   }
                 });
}

// Right padding that makes oneDNN's output size equal ours: the exact value can be below the
// left padding when (in + 2 pad - k) is not a multiple of the stride; never negative.
std::int64_t pad_right(std::int64_t in, std::int64_t out, int kernel, int stride, int pad_left) {
  return std::max<std::int64_t>(0, (out - 1) * stride + kernel - in - pad_left);
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

void accumulate(ThreadPool& pool, float* dst, const memory& src, std::int64_t n) {
  const float* s = static_cast<const float*>(src.get_data_handle());
  parallel_range(pool, n, kParallelGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      dst[i] += s[i];
  });
}

constexpr std::size_t kArenaAlign = 64;  // a cache line, and oneDNN's preferred alignment

}  // namespace

struct DnnlState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, std::unique_ptr<Prim>> cache;
  // The arena (see the top): grown to the largest primitive's arena_bytes, never shrunk.
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, FreeDeleter> arena;
  std::size_t arena_size = 0;

  template <class Build>
  Prim& get(const Key& key, const Build& build) {
    auto it = cache.find(key);
    if (it != cache.end()) return *it->second;
    auto p = std::make_unique<Prim>();
    build(*p);
    return *cache.emplace(key, std::move(p)).first->second;
  }

  // A slot of `desc`'s size in `p`'s part of the arena.
  ArenaSlot reserve(Prim& p, const memory::desc& desc) {
    ArenaSlot slot{memory(desc, engine, nullptr), p.arena_bytes};
    p.arena_bytes += (desc.get_size() + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
    return slot;
  }

  // Adds a tensor argument whose lockstep layout is `user_desc` and whose primitive layout is
  // `prim_desc`; `in_arena` puts the user-side buffer in the arena (backward-weights' outputs).
  memory add_port(Prim& p, int arg, bool output, const memory::desc& user_desc,
                  const memory::desc& prim_desc, bool in_arena = false) {
    Port port;
    port.arg = arg;
    port.output = output;
    port.user = memory(user_desc, engine, nullptr);
    if (in_arena) {
      ArenaSlot slot = reserve(p, user_desc);
      port.user = slot.mem;
      port.user_in_arena = true;
      port.user_offset = slot.offset;
    }
    if (prim_desc != user_desc) {
      port.inner = reserve(p, prim_desc);
      port.reorder = output ? dnnl::reorder(port.inner.mem, port.user)
                            : dnnl::reorder(port.user, port.inner.mem);
      port.reordered = true;
    }
    p.args.emplace(arg, port.reordered ? port.inner.mem : port.user);
    memory user = port.user;
    p.ports.push_back(std::move(port));
    return user;
  }

  void add_scratchpad(Prim& p, const dnnl::primitive_desc_base& pd) {
    p.scratchpad = reserve(p, pd.scratchpad_desc());
    p.args.emplace(DNNL_ARG_SCRATCHPAD, p.scratchpad.mem);
  }

  void set(Prim& p, int arg, const void* data) {
    for (Port& port : p.ports) {
      if (port.arg == arg) {
        port.user.set_data_handle(const_cast<void*>(data));
        return;
      }
    }
    LOCKSTEP_FAIL("oneDNN argument ", arg, " not registered");
  }

  // Points every arena slot of `p` into the arena, growing it first where needed.
  void bind_arena(Prim& p) {
    if (p.arena_bytes > arena_size) {
      arena.reset();  // before the new one: the old contents are never needed again
      void* mem = std::aligned_alloc(kArenaAlign, p.arena_bytes);
      if (!mem)
        LOCKSTEP_FAIL_HINT_TYPE(OutOfMemory, "use a smaller batch",
                                "oneDNN: cannot allocate the convolutions' arena of ",
                                format_bytes(static_cast<double>(p.arena_bytes)));
      arena.reset(mem);
      arena_size = p.arena_bytes;
    }
    char* base = static_cast<char*>(arena.get());
    p.scratchpad.mem.set_data_handle(base + p.scratchpad.offset);
    for (Port& port : p.ports) {
      if (port.user_in_arena) port.user.set_data_handle(base + port.user_offset);
      if (port.reordered) port.inner.mem.set_data_handle(base + port.inner.offset);
    }
  }

  // oneDNN's OpenMP team size is a per-calling-thread setting: give it this Context's count.
  void execute(Prim& p, int threads) {
    bind_arena(p);
    omp_set_num_threads(threads);
    for (Port& port : p.ports) {
      if (port.reordered && !port.output) port.reorder.execute(stream, port.user, port.inner.mem);
    }
    p.prim.execute(stream, p.args);
    for (Port& port : p.ports) {
      if (port.reordered && port.output) port.reorder.execute(stream, port.inner.mem, port.user);
    }
    stream.wait();
  }
};

CpuBackend::CpuBackend(Context& ctx) : ctx_(ctx), dnnl_(std::make_unique<DnnlState>()) {
  init_openblas_once();
}
CpuBackend::~CpuBackend() = default;

namespace {

struct ConvGeom {
  memory::dims src, wei, bias, dst, strides, pad_l, pad_r;
};
ConvGeom conv_geom(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p) {
  ConvGeom g;
  g.src = {x[0], x[1], x[2], x[3]};
  g.wei = {w[0], w[1], w[2], w[3]};
  g.bias = {w[0]};
  g.dst = {y[0], y[1], y[2], y[3]};
  g.strides = {p.stride_h, p.stride_w};
  g.pad_l = {p.pad_h, p.pad_w};
  g.pad_r = {pad_right(x[2], y[2], static_cast<int>(w[2]), p.stride_h, p.pad_h),
             pad_right(x[3], y[3], static_cast<int>(w[3]), p.stride_w, p.pad_w)};
  return g;
}
// bf16_inputs: which activation tensors are bf16 (bit 0: x, bit 1: dy, bit 2: the forward's y).
Key conv_key(PrimKind kind, const Shape& x, const Shape& w, const Conv2dParams& p, bool bias,
             bool bf16, int bf16_inputs = 0) {
  return {static_cast<std::int64_t>(kind),
          x[0],
          x[1],
          x[2],
          x[3],
          w[0],
          w[2],
          w[3],
          p.stride_h,
          p.stride_w,
          p.pad_h,
          p.pad_w,
          bias ? 1 : 0,
          bf16 ? 1 : 0,
          static_cast<std::int64_t>(p.layout),
          bf16_inputs};
}
// Inputs (src, weights) are bf16 when `in` is; bias stays f32, and dst is `out` (f32, or bf16 when
// the caller asked for a rounded output: oneDNN rounds its f32 accumulators to nearest even).
dnnl::convolution_forward::primitive_desc conv_fwd_pd(const ConvGeom& g, ImageLayout layout,
                                                      bool bias, bool blocked, Dt in,
                                                      const dnnl::engine& eng, Dt out = Dt::f32) {
  using CF = dnnl::convolution_forward;
  const auto src = activation(g.src, layout, blocked, in),
             wei = weights(g.wei, layout, blocked, in);
  const auto dst = activation(g.dst, layout, blocked, out);
  auto d = bias ? CF::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                           src, wei, plain(g.bias, Tag::x), dst, g.strides, g.pad_l, g.pad_r)
                : CF::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                           src, wei, dst, g.strides, g.pad_l, g.pad_r);
  return CF::primitive_desc(d, user_scratchpad(), eng);
}

}  // namespace

void CpuBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                                const Conv2dParams& p) {
  const bool bias = b.defined();
  DnnlState& s = *dnnl_;
  const Dt in = ctx_.precision() == Precision::BF16 ? Dt::bf16 : Dt::f32;
  const bool x16 = x.dtype() == DType::BF16, y16 = y.dtype() == DType::BF16;
  Prim& prim =
      s.get(conv_key(PrimKind::ConvFwd, x.shape(), w.shape(), p, bias, in == Dt::bf16,
                     (x16 ? 1 : 0) | (y16 ? 4 : 0)),
            [&](Prim& e) {
              ConvGeom g = conv_geom(x.shape(), w.shape(), y.shape(), p);
              const Tag act = user_tag(p.layout);
              auto pd = conv_fwd_pd(g, p.layout, bias, g.src[1] >= kBlockedMinChannels, in,
                                    s.engine, dt_of(y));
              e.prim = dnnl::convolution_forward(pd);
              s.add_port(e, DNNL_ARG_SRC, false, plain(g.src, act, dt_of(x)), pd.src_desc());
              s.add_port(e, DNNL_ARG_WEIGHTS, false, plain(g.wei, Tag::oihw), pd.weights_desc());
              if (bias) s.add_port(e, DNNL_ARG_BIAS, false, plain(g.bias, Tag::x), pd.bias_desc());
              s.add_port(e, DNNL_ARG_DST, true, plain(g.dst, act, dt_of(y)), pd.dst_desc());
              s.add_scratchpad(e, pd);
            });
  s.set(prim, DNNL_ARG_SRC, x.raw_data());
  s.set(prim, DNNL_ARG_WEIGHTS, w.data<float>());
  if (bias) s.set(prim, DNNL_ARG_BIAS, b.data<float>());
  s.set(prim, DNNL_ARG_DST, y.raw_data());
  s.execute(prim, ctx_.threads());
}

void CpuBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx,
                                      const Conv2dParams& p) {
  if (pointwise_as_gemm(ctx_.precision(), w.shape(), p)) {  // dx[rows, I] = dy[rows, O] w[O, I]
    const std::int64_t out = w.dim(0), in = w.dim(1), rows = dy.numel() / out;
    const Tensor w_rows = w.view({out, in});
    if (p.stride_h == 1 && p.stride_w == 1) {
      Tensor dx_rows = dx.view({rows, in});
      gemm(false, false, 1.0f, dy.view({rows, out}), w_rows, 0.0f, dx_rows);
      return;
    }
    Tensor sampled = Tensor::borrow(scratch_floats(static_cast<std::size_t>(rows * in)), {rows, in},
                                    DType::F32, Device::cpu());
    gemm(false, false, 1.0f, dy.view({rows, out}), w_rows, 0.0f, sampled);
    scatter_strided_pixels(ctx_.pool(), sampled.data<float>(), p, dy.dim(2), dy.dim(3), dx);
    return;
  }
  DnnlState& s = *dnnl_;
  const Dt in = ctx_.precision() == Precision::BF16 ? Dt::bf16 : Dt::f32;
  const bool dy16 = dy.dtype() == DType::BF16;
  Prim& prim = s.get(
      conv_key(PrimKind::ConvBwdData, dx.shape(), w.shape(), p, false, in == Dt::bf16,
               dy16 ? 2 : 0),
      [&](Prim& e) {
        ConvGeom g = conv_geom(dx.shape(), w.shape(), dy.shape(), p);
        const bool blocked = g.src[1] >= kBlockedMinChannels;
        const Tag act = user_tag(p.layout);
        auto fwd = conv_fwd_pd(g, p.layout, false, blocked, in, s.engine);
        using CB = dnnl::convolution_backward_data;
        CB::desc d(dnnl::algorithm::convolution_direct, activation(g.src, p.layout, blocked),
                   weights(g.wei, p.layout, blocked, in), activation(g.dst, p.layout, blocked, in),
                   g.strides, g.pad_l, g.pad_r);
        CB::primitive_desc pd(d, user_scratchpad(), s.engine, fwd);
        e.prim = CB(pd);
        s.add_port(e, DNNL_ARG_DIFF_DST, false, plain(g.dst, act, dt_of(dy)), pd.diff_dst_desc());
        s.add_port(e, DNNL_ARG_WEIGHTS, false, plain(g.wei, Tag::oihw), pd.weights_desc());
        s.add_port(e, DNNL_ARG_DIFF_SRC, true, plain(g.src, act), pd.diff_src_desc());
        s.add_scratchpad(e, pd);
      });
  s.set(prim, DNNL_ARG_DIFF_DST, dy.raw_data());
  s.set(prim, DNNL_ARG_WEIGHTS, w.data<float>());
  s.set(prim, DNNL_ARG_DIFF_SRC, dx.data<float>());
  s.execute(prim, ctx_.threads());
}

void CpuBackend::conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& db,
                                         const Conv2dParams& p) {
  const bool bias = db.defined();
  if (pointwise_as_gemm(ctx_.precision(), dw.shape(),
                        p)) {  // dw [O, I] += dy[rows, O]^T x[rows, I]
    const std::int64_t out = dw.dim(0), in = dw.dim(1), rows = dy.numel() / out;
    Tensor dw_rows = dw.view({out, in});
    const Tensor dy_rows = dy.view({rows, out});
    Tensor x_rows;
    if (p.stride_h == 1 && p.stride_w == 1) {
      x_rows = x.view({rows, in});
    } else {  // slot 2: gemm_bf16 converts its operands in slots 0 and 1
      x_rows = casts_.scratch(ctx_, 2, {rows, in});
      gather_strided_pixels(ctx_.pool(), x, p, dy.dim(2), dy.dim(3), x_rows);
    }
    gemm(true, false, 1.0f, dy_rows, x_rows, 1.0f, dw_rows);
    if (bias) sum_rows(dy_rows, db);
    return;
  }
  DnnlState& s = *dnnl_;
  const Dt in = ctx_.precision() == Precision::BF16 ? Dt::bf16 : Dt::f32;
  const int inputs16 = (x.dtype() == DType::BF16 ? 1 : 0) | (dy.dtype() == DType::BF16 ? 2 : 0);
  Prim& prim = s.get(
      conv_key(PrimKind::ConvBwdWeights, x.shape(), dw.shape(), p, bias, in == Dt::bf16, inputs16),
      [&](Prim& e) {
        ConvGeom g = conv_geom(x.shape(), dw.shape(), dy.shape(), p);
        const bool blocked = true;  // fastest for every shape measured
        const Tag act = user_tag(p.layout);
        auto fwd = conv_fwd_pd(g, p.layout, bias, blocked, in, s.engine);
        using CB = dnnl::convolution_backward_weights;
        const auto src = activation(g.src, p.layout, blocked, in);
        const auto ddst = activation(g.dst, p.layout, blocked, in);
        const auto dwei = weights(g.wei, p.layout, blocked);
        auto d = bias ? CB::desc(dnnl::algorithm::convolution_direct, src, dwei,
                                 plain(g.bias, Tag::x), ddst, g.strides, g.pad_l, g.pad_r)
                      : CB::desc(dnnl::algorithm::convolution_direct, src, dwei, ddst, g.strides,
                                 g.pad_l, g.pad_r);
        CB::primitive_desc pd(d, user_scratchpad(), s.engine, fwd);
        e.prim = CB(pd);
        s.add_port(e, DNNL_ARG_SRC, false, plain(g.src, act, dt_of(x)), pd.src_desc());
        s.add_port(e, DNNL_ARG_DIFF_DST, false, plain(g.dst, act, dt_of(dy)), pd.diff_dst_desc());
        e.diff_weights = s.add_port(e, DNNL_ARG_DIFF_WEIGHTS, true, plain(g.wei, Tag::oihw),
                                    pd.diff_weights_desc(), /*in_arena=*/true);
        if (bias) {
          e.diff_bias = s.add_port(e, DNNL_ARG_DIFF_BIAS, true, plain(g.bias, Tag::x),
                                   pd.diff_bias_desc(), /*in_arena=*/true);
        }
        s.add_scratchpad(e, pd);
      });
  s.set(prim, DNNL_ARG_SRC, x.raw_data());
  s.set(prim, DNNL_ARG_DIFF_DST, dy.raw_data());
  s.execute(prim, ctx_.threads());
  accumulate(ctx_.pool(), dw.data<float>(), prim.diff_weights, dw.numel());
  if (bias) accumulate(ctx_.pool(), db.data<float>(), prim.diff_bias, db.numel());
}

}  // namespace lockstep::ops::cpu
