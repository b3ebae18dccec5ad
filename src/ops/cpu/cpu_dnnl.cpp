// CPU convolution and pooling through oneDNN. Each distinct (op, shape, params) gets its
// primitive, argument map and scratchpad built once and cached in this backend (so per
// Context: two Contexts never share a cache and need no lock). Memory is plain NCHW / OIHW, the
// layout of lockstep tensors, so no reorders are needed around the primitives.
// Parameter gradients accumulate (dw += ...): oneDNN writes its weight/bias gradients to
// buffers owned by the cache entry, which are then added into dw/db.
#include <omp.h>

#include <array>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "lockstep/core/error.hpp"
#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/parallel.hpp"

namespace lockstep::ops::cpu {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;
using Key = std::array<std::int64_t, 16>;

enum class PrimKind : std::int64_t { ConvFwd, ConvBwdData, ConvBwdWeights, PoolFwd, PoolBwd };

struct Prim {
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;  // user memories get their data handle set per call
  memory scratchpad;                     // owned, so execution never allocates
  memory diff_weights, diff_bias;        // owned outputs of backward-weights, added into dw/db
  std::size_t workspace_bytes = 0;       // max pooling's argmax buffer
};

memory::desc plain(const memory::dims& d, Tag tag) {
  return memory::desc(d, Dt::f32, tag);
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

void set(Prim& p, int arg, const void* data) {
  p.args.at(arg).set_data_handle(const_cast<void*>(data));
}

void accumulate(ThreadPool& pool, float* dst, const memory& src, std::int64_t n) {
  const float* s = static_cast<const float*>(src.get_data_handle());
  parallel_range(pool, n, kParallelGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      dst[i] += s[i];
  });
}

}  // namespace

struct DnnlState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, std::unique_ptr<Prim>> cache;

  template <class Build>
  Prim& get(const Key& key, const Build& build) {
    auto it = cache.find(key);
    if (it != cache.end()) return *it->second;
    auto p = std::make_unique<Prim>();
    build(*p);
    return *cache.emplace(key, std::move(p)).first->second;
  }

  void add_scratchpad(Prim& p, const dnnl::primitive_desc_base& pd) {
    p.scratchpad = memory(pd.scratchpad_desc(), engine);
    p.args.emplace(DNNL_ARG_SCRATCHPAD, p.scratchpad);
  }

  // oneDNN's OpenMP team size is a per-calling-thread setting: give it this Context's count.
  void execute(Prim& p, int threads) {
    omp_set_num_threads(threads);
    p.prim.execute(stream, p.args);
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
Key conv_key(PrimKind kind, const Shape& x, const Shape& w, const Conv2dParams& p, bool bias) {
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
          0,
          0,
          0};
}
dnnl::convolution_forward::primitive_desc conv_fwd_pd(const ConvGeom& g, bool bias,
                                                      const dnnl::engine& eng) {
  using CF = dnnl::convolution_forward;
  auto d = bias ? CF::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                           plain(g.src, Tag::nchw), plain(g.wei, Tag::oihw), plain(g.bias, Tag::x),
                           plain(g.dst, Tag::nchw), g.strides, g.pad_l, g.pad_r)
                : CF::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                           plain(g.src, Tag::nchw), plain(g.wei, Tag::oihw),
                           plain(g.dst, Tag::nchw), g.strides, g.pad_l, g.pad_r);
  return CF::primitive_desc(d, user_scratchpad(), eng);
}

}  // namespace

void CpuBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                                const Conv2dParams& p) {
  const bool bias = b.defined();
  DnnlState& s = *dnnl_;
  Prim& prim = s.get(conv_key(PrimKind::ConvFwd, x.shape(), w.shape(), p, bias), [&](Prim& e) {
    ConvGeom g = conv_geom(x.shape(), w.shape(), y.shape(), p);
    auto pd = conv_fwd_pd(g, bias, s.engine);
    e.prim = dnnl::convolution_forward(pd);
    e.args.emplace(DNNL_ARG_SRC, memory(pd.src_desc(), s.engine, nullptr));
    e.args.emplace(DNNL_ARG_WEIGHTS, memory(pd.weights_desc(), s.engine, nullptr));
    if (bias) e.args.emplace(DNNL_ARG_BIAS, memory(pd.bias_desc(), s.engine, nullptr));
    e.args.emplace(DNNL_ARG_DST, memory(pd.dst_desc(), s.engine, nullptr));
    s.add_scratchpad(e, pd);
  });
  set(prim, DNNL_ARG_SRC, x.data<float>());
  set(prim, DNNL_ARG_WEIGHTS, w.data<float>());
  if (bias) set(prim, DNNL_ARG_BIAS, b.data<float>());
  set(prim, DNNL_ARG_DST, y.data<float>());
  s.execute(prim, ctx_.threads());
}

void CpuBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx,
                                      const Conv2dParams& p) {
  DnnlState& s = *dnnl_;
  Prim& prim =
      s.get(conv_key(PrimKind::ConvBwdData, dx.shape(), w.shape(), p, false), [&](Prim& e) {
        ConvGeom g = conv_geom(dx.shape(), w.shape(), dy.shape(), p);
        auto fwd = conv_fwd_pd(g, false, s.engine);
        using CB = dnnl::convolution_backward_data;
        CB::desc d(dnnl::algorithm::convolution_direct, plain(g.src, Tag::nchw),
                   plain(g.wei, Tag::oihw), plain(g.dst, Tag::nchw), g.strides, g.pad_l, g.pad_r);
        CB::primitive_desc pd(d, user_scratchpad(), s.engine, fwd);
        e.prim = CB(pd);
        e.args.emplace(DNNL_ARG_DIFF_DST, memory(pd.diff_dst_desc(), s.engine, nullptr));
        e.args.emplace(DNNL_ARG_WEIGHTS, memory(pd.weights_desc(), s.engine, nullptr));
        e.args.emplace(DNNL_ARG_DIFF_SRC, memory(pd.diff_src_desc(), s.engine, nullptr));
        s.add_scratchpad(e, pd);
      });
  set(prim, DNNL_ARG_DIFF_DST, dy.data<float>());
  set(prim, DNNL_ARG_WEIGHTS, w.data<float>());
  set(prim, DNNL_ARG_DIFF_SRC, dx.data<float>());
  s.execute(prim, ctx_.threads());
}

void CpuBackend::conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& db,
                                         const Conv2dParams& p) {
  const bool bias = db.defined();
  DnnlState& s = *dnnl_;
  Prim& prim =
      s.get(conv_key(PrimKind::ConvBwdWeights, x.shape(), dw.shape(), p, bias), [&](Prim& e) {
        ConvGeom g = conv_geom(x.shape(), dw.shape(), dy.shape(), p);
        auto fwd = conv_fwd_pd(g, bias, s.engine);
        using CB = dnnl::convolution_backward_weights;
        auto d = bias ? CB::desc(dnnl::algorithm::convolution_direct, plain(g.src, Tag::nchw),
                                 plain(g.wei, Tag::oihw), plain(g.bias, Tag::x),
                                 plain(g.dst, Tag::nchw), g.strides, g.pad_l, g.pad_r)
                      : CB::desc(dnnl::algorithm::convolution_direct, plain(g.src, Tag::nchw),
                                 plain(g.wei, Tag::oihw), plain(g.dst, Tag::nchw), g.strides,
                                 g.pad_l, g.pad_r);
        CB::primitive_desc pd(d, user_scratchpad(), s.engine, fwd);
        e.prim = CB(pd);
        e.args.emplace(DNNL_ARG_SRC, memory(pd.src_desc(), s.engine, nullptr));
        e.args.emplace(DNNL_ARG_DIFF_DST, memory(pd.diff_dst_desc(), s.engine, nullptr));
        e.diff_weights = memory(pd.diff_weights_desc(), s.engine);
        e.args.emplace(DNNL_ARG_DIFF_WEIGHTS, e.diff_weights);
        if (bias) {
          e.diff_bias = memory(pd.diff_bias_desc(), s.engine);
          e.args.emplace(DNNL_ARG_DIFF_BIAS, e.diff_bias);
        }
        s.add_scratchpad(e, pd);
      });
  set(prim, DNNL_ARG_SRC, x.data<float>());
  set(prim, DNNL_ARG_DIFF_DST, dy.data<float>());
  s.execute(prim, ctx_.threads());
  accumulate(ctx_.pool(), dw.data<float>(), prim.diff_weights, dw.numel());
  if (bias) accumulate(ctx_.pool(), db.data<float>(), prim.diff_bias, db.numel());
}

namespace {

struct PoolGeom {
  memory::dims src, dst, strides, kernel, pad_l, pad_r;
};
PoolGeom pool_geom(const Shape& x, const Shape& y, const Pool2dParams& p) {
  PoolGeom g;
  g.src = {x[0], x[1], x[2], x[3]};
  g.dst = {y[0], y[1], y[2], y[3]};
  g.strides = {p.stride_h, p.stride_w};
  g.kernel = {p.kernel_h, p.kernel_w};
  g.pad_l = {p.pad_h, p.pad_w};
  g.pad_r = {pad_right(x[2], y[2], p.kernel_h, p.stride_h, p.pad_h),
             pad_right(x[3], y[3], p.kernel_w, p.stride_w, p.pad_w)};
  return g;
}
Key pool_key(PrimKind kind, PoolKind pk, const Shape& x, const Pool2dParams& p) {
  return {static_cast<std::int64_t>(kind),
          static_cast<std::int64_t>(pk),
          x[0],
          x[1],
          x[2],
          x[3],
          p.kernel_h,
          p.kernel_w,
          p.stride_h,
          p.stride_w,
          p.pad_h,
          p.pad_w,
          0,
          0,
          0,
          0};
}
// Average pooling counts the zero padding in the divisor, as PyTorch's default
// (count_include_pad=True).
dnnl::algorithm pool_algorithm(PoolKind kind) {
  return kind == PoolKind::Max ? dnnl::algorithm::pooling_max
                               : dnnl::algorithm::pooling_avg_include_padding;
}
dnnl::pooling_forward::primitive_desc pool_fwd_pd(PoolKind kind, const PoolGeom& g,
                                                  const dnnl::engine& eng) {
  using PF = dnnl::pooling_forward;
  PF::desc d(dnnl::prop_kind::forward_training, pool_algorithm(kind), plain(g.src, Tag::nchw),
             plain(g.dst, Tag::nchw), g.strides, g.kernel, g.pad_l, g.pad_r);
  return PF::primitive_desc(d, user_scratchpad(), eng);
}

}  // namespace

void CpuBackend::pool2d_forward(PoolKind kind, const Tensor& x, Tensor& y, Tensor& workspace,
                                const Pool2dParams& p) {
  DnnlState& s = *dnnl_;
  Prim& prim = s.get(pool_key(PrimKind::PoolFwd, kind, x.shape(), p), [&](Prim& e) {
    auto pd = pool_fwd_pd(kind, pool_geom(x.shape(), y.shape(), p), s.engine);
    e.prim = dnnl::pooling_forward(pd);
    e.args.emplace(DNNL_ARG_SRC, memory(pd.src_desc(), s.engine, nullptr));
    e.args.emplace(DNNL_ARG_DST, memory(pd.dst_desc(), s.engine, nullptr));
    e.workspace_bytes = pd.workspace_desc().get_size();
    if (e.workspace_bytes)
      e.args.emplace(DNNL_ARG_WORKSPACE, memory(pd.workspace_desc(), s.engine, nullptr));
    s.add_scratchpad(e, pd);
  });
  set(prim, DNNL_ARG_SRC, x.data<float>());
  set(prim, DNNL_ARG_DST, y.data<float>());
  if (prim.workspace_bytes) {
    if (!workspace.defined() || workspace.nbytes() != prim.workspace_bytes ||
        !workspace.device().is_cpu() || workspace.dtype() != DType::U8) {
      workspace = Tensor::empty({static_cast<std::int64_t>(prim.workspace_bytes)}, DType::U8);
    }
    set(prim, DNNL_ARG_WORKSPACE, workspace.raw_data());
  }
  s.execute(prim, ctx_.threads());
}

void CpuBackend::pool2d_backward(PoolKind kind, const Tensor& dy, const Tensor& workspace,
                                 Tensor& dx, const Pool2dParams& p) {
  DnnlState& s = *dnnl_;
  Prim& prim = s.get(pool_key(PrimKind::PoolBwd, kind, dx.shape(), p), [&](Prim& e) {
    PoolGeom g = pool_geom(dx.shape(), dy.shape(), p);
    auto fwd = pool_fwd_pd(kind, g, s.engine);
    using PB = dnnl::pooling_backward;
    PB::desc d(pool_algorithm(kind), plain(g.src, Tag::nchw), plain(g.dst, Tag::nchw), g.strides,
               g.kernel, g.pad_l, g.pad_r);
    PB::primitive_desc pd(d, user_scratchpad(), s.engine, fwd);
    e.prim = PB(pd);
    e.args.emplace(DNNL_ARG_DIFF_DST, memory(pd.diff_dst_desc(), s.engine, nullptr));
    e.args.emplace(DNNL_ARG_DIFF_SRC, memory(pd.diff_src_desc(), s.engine, nullptr));
    e.workspace_bytes = fwd.workspace_desc().get_size();
    if (e.workspace_bytes)
      e.args.emplace(DNNL_ARG_WORKSPACE, memory(fwd.workspace_desc(), s.engine, nullptr));
    s.add_scratchpad(e, pd);
  });
  if (prim.workspace_bytes) {
    LOCKSTEP_CHECK_HINT(workspace.defined() && workspace.nbytes() == prim.workspace_bytes,
                        "pass the workspace that pool2d_forward returned for this input",
                        "pool2d_backward: workspace is ", workspace.describe(), ", expected ",
                        prim.workspace_bytes, " bytes from pool2d_forward with this shape");
    set(prim, DNNL_ARG_WORKSPACE, workspace.raw_data());
  }
  set(prim, DNNL_ARG_DIFF_DST, dy.data<float>());
  set(prim, DNNL_ARG_DIFF_SRC, dx.data<float>());
  s.execute(prim, ctx_.threads());
}

}  // namespace lockstep::ops::cpu
