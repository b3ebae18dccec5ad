// cuDNN convolutions: ConvPlans (conv.hpp: the algorithm chosen once per shape, the lazy cuDNN
// handle) and CudaBackend's conv2d methods, which convert around cuDNN's bf16 convolutions, give
// channels-last convolutions their filters channels-last, and add the bias (cuda_elementwise.cu's
// channel-bias launchers).
#include "ops/cuda/conv.hpp"

#include <atomic>
#include <climits>
#include <cstdio>
#include <optional>

#include "ops/cuda/check.hpp"
#include "ops/cuda/cuda_backend.hpp"

namespace lockstep::ops::cuda {
namespace {

int as_int(std::int64_t v, const char* what) {
  LOCKSTEP_CHECK(v >= 0 && v <= INT_MAX, "convolution ", what, " = ", v,
                 " exceeds cuDNN's 32-bit dimension limit");
  return static_cast<int>(v);
}

cudnnTensorFormat_t format_of(ImageLayout layout) {
  return layout == ImageLayout::NHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
}

void set_tensor(cudnnTensorDescriptor_t desc, const Shape& s, cudnnDataType_t type,
                ImageLayout layout) {
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnSetTensor4dDescriptor(desc, format_of(layout), type,
                                                       as_int(s[0], "N"), as_int(s[1], "C"),
                                                       as_int(s[2], "H"), as_int(s[3], "W")));
}

}  // namespace

// One direction's choice: the algorithm (as int: the three directions have three enum types),
// its math type and its workspace.
struct ConvPlans::Algo {
  int algo = 0;
  cudnnMathType_t math{};
  std::size_t bytes = 0;
};

struct ConvPlans::Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  std::optional<Algo> fwd, bwd_data, bwd_filter;

  ~Plan() {
    if (conv) dyn::cudnnDestroyConvolutionDescriptor(conv);
    if (w) dyn::cudnnDestroyFilterDescriptor(w);
    if (y) dyn::cudnnDestroyTensorDescriptor(y);
    if (x) dyn::cudnnDestroyTensorDescriptor(x);
  }
};

ConvPlans::ConvPlans(Device device, cudaStream_t stream) : device_(device) {
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnCreate(&handle_));
  try {
    LOCKSTEP_CHECK_CUDNN(dyn::cudnnSetStream(handle_, stream));
  } catch (...) {
    dyn::cudnnDestroy(handle_);
    throw;
  }
}

ConvPlans::~ConvPlans() {
  plans_.clear();  // descriptors before the handle
  if (handle_) dyn::cudnnDestroy(handle_);
}

// The algorithm search, once for the three directions: `call(capacity, &count, perfs)` runs the
// direction's cudnnFind*Algorithm.
template <class Perf, int kCount, class Find>
ConvPlans::Algo ConvPlans::find(const char* direction, const std::string& operands, Find&& call) {
  Perf perfs[kCount];
  int count = 0;
  LOCKSTEP_CHECK_CUDNN(call(kCount, &count, perfs));
  const Perf* best = pick_conv_algorithm(perfs, count);
  LOCKSTEP_CHECK_HINT(best,
                      "use a smaller batch, or train.precision = fp32 (cuDNN's f32 algorithms "
                      "cover every shape)",
                      "no cuDNN ", direction, " algorithm for the convolution of ", operands,
                      " runs within ", kConvWorkspaceLimit >> 20, " MiB of workspace (", count,
                      " tried)");
  if (best->determinism != CUDNN_DETERMINISTIC) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      std::fprintf(stderr,
                   "warning: cuDNN has no deterministic %s algorithm for the convolution of %s; "
                   "using the fastest non-deterministic one, so runs with convolutions are not "
                   "bitwise repeatable (further such choices are not reported)\n",
                   direction, operands.c_str());
  }
  return Algo{static_cast<int>(best->algo), best->mathType, best->memory};
}

ConvPlans::Plan& ConvPlans::plan_for(const Shape& x, const Shape& w, const Shape& y,
                                     const Conv2dParams& p, Precision precision) {
  Key key{x[0],
          x[1],
          x[2],
          x[3],
          w[0],
          w[1],
          w[2],
          w[3],
          p.stride_h,
          p.stride_w,
          p.pad_h,
          p.pad_w,
          static_cast<std::int64_t>(precision),
          static_cast<std::int64_t>(p.layout)};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnCreateTensorDescriptor(&plan->x));
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnCreateTensorDescriptor(&plan->y));
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnCreateFilterDescriptor(&plan->w));
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnCreateConvolutionDescriptor(&plan->conv));
  const cudnnDataType_t data =
      precision == Precision::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  set_tensor(plan->x, x, data, p.layout);
  set_tensor(plan->y, y, data, p.layout);
  // A channels-last plan takes its filter channels-last too ([O, KH, KW, I]: the backend
  // transposes it), the layout cuDNN's NHWC tensor-core kernels read without a conversion.
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnSetFilter4dDescriptor(plan->w, data, format_of(p.layout),
                                                       as_int(w[0], "O"), as_int(w[1], "I"),
                                                       as_int(w[2], "KH"), as_int(w[3], "KW")));
  LOCKSTEP_CHECK_CUDNN(
      dyn::cudnnSetConvolution2dDescriptor(plan->conv, p.pad_h, p.pad_w, p.stride_h, p.stride_w, 1,
                                           1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  // The compute type stays f32 (bf16: accumulation in f32). FMA math excludes TF32 tensor cores,
  // so cudnnFind offers fp32 plans true f32 algorithms only; tf32 and bf16 plans may use tensor
  // cores. cudnnFind reports each algorithm's math type, which forward() etc. then set.
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnSetConvolutionMathType(
      plan->conv, precision == Precision::FP32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  Plan& ref = *plan;
  plans_.emplace(key, std::move(plan));
  return ref;
}

Tensor ConvPlans::workspace(std::size_t bytes) {
  if (bytes == 0) return {};
  return Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::U8, device_);
}

void ConvPlans::forward(const Tensor& x, const Tensor& w, Tensor& y, const Conv2dParams& p,
                        Precision precision) {
  Plan& plan = plan_for(x.shape(), w.shape(), y.shape(), p, precision);
  if (!plan.fwd)
    plan.fwd = find<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
        "forward", x.describe() + " with " + w.describe(), [&](int cap, int* count, auto* perfs) {
          return dyn::cudnnFindConvolutionForwardAlgorithm(handle_, plan.x, plan.w, plan.conv,
                                                           plan.y, cap, count, perfs);
        });
  const Algo& a = *plan.fwd;
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnSetConvolutionMathType(plan.conv, a.math));
  Tensor ws = workspace(a.bytes);
  const float one = 1.0f, zero = 0.0f;
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnConvolutionForward(
      handle_, &one, plan.x, x.raw_data(), plan.w, w.raw_data(), plan.conv,
      static_cast<cudnnConvolutionFwdAlgo_t>(a.algo), ws.defined() ? ws.raw_data() : nullptr,
      a.bytes, &zero, plan.y, y.raw_data()));
}

void ConvPlans::backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const Conv2dParams& p,
                              Precision precision) {
  Plan& plan = plan_for(dx.shape(), w.shape(), dy.shape(), p, precision);
  if (!plan.bwd_data)
    plan.bwd_data = find<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
        "backward-data", dx.describe() + " with " + w.describe(),
        [&](int cap, int* count, auto* perfs) {
          return dyn::cudnnFindConvolutionBackwardDataAlgorithm(handle_, plan.w, plan.y, plan.conv,
                                                                plan.x, cap, count, perfs);
        });
  const Algo& a = *plan.bwd_data;
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnSetConvolutionMathType(plan.conv, a.math));
  Tensor ws = workspace(a.bytes);
  const float one = 1.0f, zero = 0.0f;
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnConvolutionBackwardData(
      handle_, &one, plan.w, w.raw_data(), plan.y, dy.raw_data(), plan.conv,
      static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo), ws.defined() ? ws.raw_data() : nullptr,
      a.bytes, &zero, plan.x, dx.raw_data()));
}

void ConvPlans::backward_filter(const Tensor& x, const Tensor& dy, Tensor& dw,
                                const Conv2dParams& p, Precision precision, bool accumulate) {
  Plan& plan = plan_for(x.shape(), dw.shape(), dy.shape(), p, precision);
  if (!plan.bwd_filter)
    plan.bwd_filter =
        find<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
            "backward-filter", x.describe() + " with " + dw.describe(),
            [&](int cap, int* count, auto* perfs) {
              return dyn::cudnnFindConvolutionBackwardFilterAlgorithm(
                  handle_, plan.x, plan.y, plan.conv, plan.w, cap, count, perfs);
            });
  const Algo& a = *plan.bwd_filter;
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnSetConvolutionMathType(plan.conv, a.math));
  Tensor ws = workspace(a.bytes);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;  // parameter gradients accumulate
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnConvolutionBackwardFilter(
      handle_, &one, plan.x, x.raw_data(), plan.y, dy.raw_data(), plan.conv,
      static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo), ws.defined() ? ws.raw_data() : nullptr,
      a.bytes, &beta, plan.w, dw.raw_data()));
}

// cuDNN only for contexts that convolve: creating its handle costs time and memory (and loads
// the library) that a GPT's context would spend for nothing.
ConvPlans& CudaBackend::conv() {
  if (!conv_) conv_ = std::make_unique<ConvPlans>(device_, stream_);
  return *conv_;
}

namespace {

bool channels_last(const Conv2dParams& p) {
  return p.layout == ImageLayout::NHWC;
}
// A filter [O, I, KH, KW] as the batch_transpose of [O, I, KH*KW] into [O, KH*KW, I] and back.
struct FilterDims {
  i64 o, i, k;
};
FilterDims filter_dims(const Tensor& w) {
  return {w.dim(0), w.dim(1), w.dim(2) * w.dim(3)};
}

}  // namespace

Tensor CudaBackend::conv_filter_scratch(const Shape& shape) {
  const std::int64_t n = shape_numel(shape);
  if (!filter_scratch_.defined() || filter_scratch_.numel() < n)
    filter_scratch_ = Tensor::empty({n}, DType::F32, device_);
  return filter_scratch_.sub(0, shape);
}

// The filter as cuDNN's plan for `p` takes it: bf16 under the bf16 policy (cast once per reuse
// window), channels-last ([O, KH, KW, I], transposed per call: filters are small) for NHWC.
Tensor CudaBackend::conv_filter(const Tensor& w, const Conv2dParams& p) {
  const bool bf16 = ctx_.precision() == Precision::BF16;
  if (!channels_last(p)) return bf16 ? casts_.get(ctx_, w, 1, to_bf16()) : w;
  const FilterDims d = filter_dims(w);
  if (bf16) {
    Tensor w16 = casts_.get(ctx_, w, 1, to_bf16());
    Tensor t = casts_.scratch(ctx_, 3, w.shape());
    cuda::batch_transpose(bf16_data(w16), bf16_data(t), d.o, d.i, d.k, stream_);
    return t;
  }
  Tensor t = conv_filter_scratch(w.shape());
  cuda::batch_transpose(w.data<float>(), t.data<float>(), d.o, d.i, d.k, /*accumulate=*/false,
                        stream_);
  return t;
}

void CudaBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                                 const Conv2dParams& p) {
  activate();
  Tensor wc = conv_filter(w, p);
  if (ctx_.precision() == Precision::BF16) {
    Tensor x16 = casts_.get(ctx_, x, 0, to_bf16());
    Tensor y16 = casts_.scratch(ctx_, 2, y.shape());
    conv().forward(x16, wc, y16, p, Precision::BF16);
    bf16_to_f32(bf16_data(y16), y.data<float>(), y.numel(), stream_);
  } else {
    conv().forward(x, wc, y, p, ctx_.precision());
  }
  if (b.defined()) {
    // Per channel: NCHW is [N, C, H*W], NHWC [N*H*W, C, 1].
    const i64 pixels = y.dim(2) * y.dim(3);
    if (channels_last(p))
      add_channel_bias(y.data<float>(), b.data<float>(), y.dim(0) * pixels, y.dim(1), 1, stream_);
    else
      add_channel_bias(y.data<float>(), b.data<float>(), y.dim(0), y.dim(1), pixels, stream_);
  }
}
void CudaBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx,
                                       const Conv2dParams& p) {
  activate();
  Tensor wc = conv_filter(w, p);
  if (ctx_.precision() == Precision::BF16) {
    Tensor dy16 = casts_.get(ctx_, dy, 0, to_bf16());
    Tensor dx16 = casts_.scratch(ctx_, 2, dx.shape());
    conv().backward_data(dy16, wc, dx16, p, Precision::BF16);
    bf16_to_f32(bf16_data(dx16), dx.data<float>(), dx.numel(), stream_);
  } else {
    conv().backward_data(dy, wc, dx, p, ctx_.precision());
  }
}
void CudaBackend::conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& db,
                                          const Conv2dParams& p) {
  activate();
  const FilterDims d = filter_dims(dw);
  if (ctx_.precision() == Precision::BF16) {
    // cuDNN's bf16 convolutions write bf16 (no f32-output configuration in its legacy API),
    // so this micro-step's weight gradient is rounded once, then accumulated in f32.
    Tensor x16 = casts_.get(ctx_, x, 0, to_bf16()), dy16 = casts_.get(ctx_, dy, 1, to_bf16());
    Tensor dw16 = casts_.scratch(ctx_, 2, dw.shape());
    conv().backward_filter(x16, dy16, dw16, p, Precision::BF16, /*accumulate=*/false);
    if (channels_last(p)) {  // [O, KH, KW, I] back to [O, I, KH, KW]
      Tensor t = casts_.scratch(ctx_, 3, dw.shape());
      cuda::batch_transpose(bf16_data(dw16), bf16_data(t), d.o, d.k, d.i, stream_);
      dw16 = t;
    }
    add_bf16_to_f32(bf16_data(dw16), dw.data<float>(), dw.numel(), stream_);
  } else if (channels_last(p)) {
    Tensor t = conv_filter_scratch(dw.shape());
    conv().backward_filter(x, dy, t, p, ctx_.precision(), /*accumulate=*/false);
    cuda::batch_transpose(t.data<float>(), dw.data<float>(), d.o, d.k, d.i, /*accumulate=*/true,
                          stream_);
  } else {
    conv().backward_filter(x, dy, dw, p, ctx_.precision(), /*accumulate=*/true);
  }
  if (db.defined()) {
    const i64 pixels = dy.dim(2) * dy.dim(3);
    if (channels_last(p))
      sum_channels_acc(dy.data<float>(), db.data<float>(), dy.dim(0) * pixels, dy.dim(1), 1,
                       stream_);
    else
      sum_channels_acc(dy.data<float>(), db.data<float>(), dy.dim(0), dy.dim(1), pixels, stream_);
  }
}

}  // namespace lockstep::ops::cuda
