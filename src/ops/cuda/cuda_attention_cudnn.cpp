// cuDNN's fused attention through the cuDNN frontend's graph API (cuda_attention_cudnn.hpp says
// what and why). The frontend is header-only third-party code that scripts/install-deps.sh
// fetches; CMake compiles this file with it (LOCKSTEP_HAVE_CUDNN_FRONTEND) in its
// dynamic-loading mode, so no cuDNN symbol is linked: the frontend reads cuDNN's functions from
// the handle lockstep's loader opened (dynload.hpp). For its CUDA runtime calls it dlopens
// libcudart.so.12, then .13, by name (normally the one this program already runs on; docs/GPT.md
// says what to set where both are on the path). Built without the frontend, check() says so and the
// attention ops run lockstep's own kernels (or refuse train.attention = cudnn with that reason).
#include "ops/cuda/cuda_attention_cudnn.hpp"

#include <array>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "lockstep/core/error.hpp"
#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/dynload.hpp"
#include "ops/cuda/check.hpp"

#ifdef LOCKSTEP_HAVE_CUDNN_FRONTEND
#include <cudnn_frontend.h>

// The frontend's dynamic-loading mode reads every cuDNN function from this handle, which the
// program defines and sets (lockstep's loader opens the library: open_cudnn below).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend
#endif

namespace lockstep::ops::cuda {
namespace {

using i64 = std::int64_t;
using Key = std::array<i64, 4>;  // b, t, heads, head_dim

std::string shape_of(const Key& k) {
  return str("qkv [", k[0], ", ", k[1], ", 3 x ", k[2], " heads x ", k[3], "]");
}

}  // namespace

#ifdef LOCKSTEP_HAVE_CUDNN_FRONTEND
std::string cudnn_frontend_version() {
  return str(CUDNN_FRONTEND_MAJOR_VERSION, ".", CUDNN_FRONTEND_MINOR_VERSION, ".",
             CUDNN_FRONTEND_PATCH_VERSION);
}

namespace {

namespace fe = cudnn_frontend;
using Uid = fe::graph::Tensor_attributes::uid_t;
enum : Uid { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// The strides that make q, k, v (and dq, dk, dv) [b, heads, t, d] views of a [b, t, 3c] buffer
// and out, dout views of [b, t, c]; the statistics are [b, heads, t, 1], our lse's layout.
struct Layout {
  std::vector<i64> dim, qkv_stride, out_stride, stats_dim, stats_stride;
  float scale;
};
Layout layout(const Key& k) {
  const i64 b = k[0], t = k[1], h = k[2], d = k[3], c = h * d;
  return {{b, h, t, d}, {t * 3 * c, d, 3 * c, 1}, {t * c, d, c, 1},
          {b, h, t, 1}, {h * t, t, 1, 1},         1.0f / std::sqrt(static_cast<float>(d))};
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid,
                                                    const std::vector<i64>& dim,
                                                    const std::vector<i64>& stride) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
}

// Causal attention with the mask's diagonal at the top left: query t sees keys 0..t.
std::shared_ptr<fe::graph::Graph> forward_graph(const Layout& l) {
  auto g = new_graph();
  auto q = input(*g, "q", kQ, l.dim, l.qkv_stride);
  auto k = input(*g, "k", kK, l.dim, l.qkv_stride);
  auto v = input(*g, "v", kV, l.dim, l.qkv_stride);
  auto [o, stats] = g->sdpa(q, k, v,
                            fe::graph::SDPA_attributes()
                                .set_name("attention")
                                .set_generate_stats(true)
                                .set_attn_scale(l.scale)
                                .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                                .set_diagonal_band_right_bound(0));
  o->set_output(true).set_uid(kO).set_dim(l.dim).set_stride(l.out_stride);
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(l.stats_dim)
      .set_stride(l.stats_stride);
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const Layout& l) {
  auto g = new_graph();
  auto q = input(*g, "q", kQ, l.dim, l.qkv_stride);
  auto k = input(*g, "k", kK, l.dim, l.qkv_stride);
  auto v = input(*g, "v", kV, l.dim, l.qkv_stride);
  auto o = input(*g, "o", kO, l.dim, l.out_stride);
  auto dout = input(*g, "dO", kDO, l.dim, l.out_stride);
  auto stats = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("stats")
                             .set_uid(kStats)
                             .set_dim(l.stats_dim)
                             .set_stride(l.stats_stride)
                             .set_data_type(fe::DataType_t::FLOAT));
  auto [dq, dk, dv] =
      g->sdpa_backward(q, k, v, o, dout, stats,
                       fe::graph::SDPA_backward_attributes()
                           .set_name("attention_backward")
                           .set_attn_scale(l.scale)
                           .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                           .set_diagonal_band_right_bound(0)
                           .set_deterministic_algorithm(true));
  dq->set_output(true).set_uid(kDQ).set_dim(l.dim).set_stride(l.qkv_stride);
  dk->set_output(true).set_uid(kDK).set_dim(l.dim).set_stride(l.qkv_stride);
  dv->set_output(true).set_uid(kDV).set_dim(l.dim).set_stride(l.qkv_stride);
  return g;
}

// Builds g on the handle (validate, cuDNN's operation graph, heuristics mode A, support check,
// plans) and reads its workspace size; "" or why not, in cuDNN's words.
std::string build(fe::graph::Graph& g, cudnnHandle_t handle, i64& workspace) {
  try {
    fe::error_t status = g.build(handle, {fe::HeurMode_t::A});
    if (status.is_good()) status = g.get_workspace_size(workspace);
    return status.is_good() ? "" : status.get_message();
  } catch (const std::exception& e) {  // the dynamic-loading shim throws for a missing symbol
    return e.what();
  }
}

std::string version_string(std::size_t v) {  // cudnnGetVersion: major * 10000 + minor * 100 + patch
  return str(v / 10000, ".", v / 100 % 100, ".", v % 100);
}

}  // namespace

struct CudnnAttention::Impl {
  struct Graphs {
    std::shared_ptr<fe::graph::Graph> forward, backward;  // null when refused
    i64 forward_workspace = 0, backward_workspace = 0;
    AttentionChoice choice;  // Cudnn and what runs, or Reference and cuDNN's refusal
  };

  Device device;
  cudaStream_t stream;
  cudnnHandle_t handle = nullptr;
  std::string load_error;  // not empty: cuDNN did not load, and why (asked once)
  std::string version;
  std::map<Key, Graphs> graphs;

  // Opens cuDNN through lockstep's loader and hands it to the frontend; makes the handle on
  // the context's stream. "" or why not.
  std::string open() {
    if (handle != nullptr || !load_error.empty()) return load_error;
    try {
      void* lib = dyn::open(dyn::Library::Cudnn);  // the same handle for every context
      static std::once_flag once;
      std::call_once(once, [lib] { fe::cudnn_dlhandle = lib; });
      version = version_string(dyn::cudnnGetVersion());
      LOCKSTEP_CHECK_CUDNN(dyn::cudnnCreate(&handle));
      LOCKSTEP_CHECK_CUDNN(dyn::cudnnSetStream(handle, stream));
    } catch (const Error& e) {
      handle = nullptr;
      load_error = e.message() + (e.hint().empty() ? "" : " (" + e.hint() + ")");
    }
    return load_error;
  }

  const Graphs& graphs_for(const Key& key) {
    auto it = graphs.find(key);
    if (it != graphs.end()) return it->second;
    Graphs g;
    const Layout l = layout(key);
    g.forward = forward_graph(l);
    std::string refusal, why = build(*g.forward, handle, g.forward_workspace);
    if (!why.empty()) {
      refusal = "cuDNN " + version + " refused the forward graph: " + why;
    } else {
      g.backward = backward_graph(l);
      why = build(*g.backward, handle, g.backward_workspace);
      if (!why.empty()) refusal = "cuDNN " + version + " refused the backward graph: " + why;
    }
    if (refusal.empty()) {
      g.choice = {AttentionKernel::Cudnn,
                  str("cuDNN ", version, " fused flash attention (frontend ",
                      cudnn_frontend_version(), "): bf16 q, k, v and gradients, f32 statistics, ",
                      "deterministic backward; workspaces ", format_bytes(g.forward_workspace),
                      " and ", format_bytes(g.backward_workspace), " for ", shape_of(key))};
    } else {
      g.choice = {AttentionKernel::Reference, refusal};
      g.forward.reset(), g.backward.reset();
    }
    return graphs.emplace(key, std::move(g)).first->second;
  }

  const Graphs& accepted(const Key& key) {
    const Graphs* g = handle != nullptr ? &graphs_for(key) : nullptr;
    LOCKSTEP_CHECK(g != nullptr && g->forward, "cuDNN attention on ", device.str(), " for ",
                   shape_of(key), " that cuDNN did not accept",
                   g != nullptr ? ": " + g->choice.detail : std::string(": cuDNN is not loaded"));
    return *g;
  }

  void execute(const fe::graph::Graph& graph, i64 workspace_bytes,
               std::unordered_map<Uid, void*>& pack, const char* what) {
    Tensor workspace;
    if (workspace_bytes > 0) workspace = Tensor::empty({workspace_bytes}, DType::U8, device);
    const fe::error_t status =
        graph.execute(handle, pack, workspace_bytes > 0 ? workspace.raw_data() : nullptr);
    LOCKSTEP_CHECK(status.is_good(), "cuDNN ", version, " attention ", what, " on ", device.str(),
                   " failed: ", status.err_msg);
  }
};

CudnnAttention::CudnnAttention(Device device, cudaStream_t stream)
    : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  impl_->stream = stream;
}

CudnnAttention::~CudnnAttention() {
  if (impl_->handle == nullptr) return;
  impl_->graphs.clear();
  (void)dyn::cudnnDestroy(impl_->handle);
}

AttentionChoice CudnnAttention::check(Precision p, std::int64_t b, std::int64_t t, int heads,
                                      std::int64_t head_dim) {
  if (p != Precision::BF16)
    return {AttentionKernel::Reference,
            str("cuDNN's fused attention computes in bf16, and this context's precision is ",
                precision_name(p), " (it needs train.precision = bf16)")};
  if (std::string why = impl_->open(); !why.empty())
    return {AttentionKernel::Reference, "cuDNN does not load: " + why};
  // Built once per shape: afterwards a map lookup (the ops ask at every call under auto).
  return impl_->graphs_for({b, t, heads, head_dim}).choice;
}

void CudnnAttention::forward(const std::uint16_t* qkv, std::uint16_t* out, float* lse,
                             std::int64_t b, std::int64_t t, std::int64_t c, int heads) {
  const Impl::Graphs& g = impl_->accepted({b, t, heads, c / heads});
  auto* in = const_cast<std::uint16_t*>(qkv);  // the variant pack takes void*
  std::unordered_map<Uid, void*> pack = {
      {kQ, in}, {kK, in + c}, {kV, in + 2 * c}, {kO, out}, {kStats, lse}};
  impl_->execute(*g.forward, g.forward_workspace, pack, "forward");
}

void CudnnAttention::backward(const std::uint16_t* qkv, const std::uint16_t* out,
                              const std::uint16_t* dout, const float* lse, std::uint16_t* dqkv,
                              std::int64_t b, std::int64_t t, std::int64_t c, int heads) {
  const Impl::Graphs& g = impl_->accepted({b, t, heads, c / heads});
  auto* in = const_cast<std::uint16_t*>(qkv);
  std::unordered_map<Uid, void*> pack = {{kQ, in},
                                         {kK, in + c},
                                         {kV, in + 2 * c},
                                         {kO, const_cast<std::uint16_t*>(out)},
                                         {kDO, const_cast<std::uint16_t*>(dout)},
                                         {kStats, const_cast<float*>(lse)},
                                         {kDQ, dqkv},
                                         {kDK, dqkv + c},
                                         {kDV, dqkv + 2 * c}};
  impl_->execute(*g.backward, g.backward_workspace, pack, "backward");
}

#else  // no frontend in this build

std::string cudnn_frontend_version() {
  return "";
}

struct CudnnAttention::Impl {
  Device device;
};

CudnnAttention::CudnnAttention(Device device, cudaStream_t) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
}
CudnnAttention::~CudnnAttention() = default;

AttentionChoice CudnnAttention::check(Precision, std::int64_t, std::int64_t, int, std::int64_t) {
  return {AttentionKernel::Reference,
          "this build has no cuDNN frontend (the headers its fused attention is written with): "
          "run scripts/install-deps.sh --cudnn-frontend, then build again"};
}

void CudnnAttention::forward(const std::uint16_t*, std::uint16_t*, float*, std::int64_t b,
                             std::int64_t t, std::int64_t c, int heads) {
  LOCKSTEP_FAIL("cuDNN attention on ", impl_->device.str(), " for ",
                shape_of({b, t, heads, c / heads}), ": this build has no cuDNN frontend");
}

void CudnnAttention::backward(const std::uint16_t*, const std::uint16_t*, const std::uint16_t*,
                              const float*, std::uint16_t*, std::int64_t b, std::int64_t t,
                              std::int64_t c, int heads) {
  LOCKSTEP_FAIL("cuDNN attention on ", impl_->device.str(), " for ",
                shape_of({b, t, heads, c / heads}), ": this build has no cuDNN frontend");
}

#endif

}  // namespace lockstep::ops::cuda
