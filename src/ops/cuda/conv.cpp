#include "ops/cuda/conv.hpp"

#include <climits>

#include "ops/cuda/check.hpp"

namespace lockstep::ops::cuda {
namespace {

int as_int(std::int64_t v, const char* what) {
  LOCKSTEP_CHECK(v >= 0 && v <= INT_MAX, "convolution ", what, " = ", v,
                 " exceeds cuDNN's 32-bit dimension limit");
  return static_cast<int>(v);
}

void set_tensor(cudnnTensorDescriptor_t desc, const Shape& s, cudnnDataType_t type) {
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnSetTensor4dDescriptor(desc, CUDNN_TENSOR_NCHW, type,
                                                       as_int(s[0], "N"), as_int(s[1], "C"),
                                                       as_int(s[2], "H"), as_int(s[3], "W")));
}

// cudnnFind returns its results fastest first: take the first that ran, is deterministic (the
// design promises bitwise-repeatable runs; this excludes the atomics-based backward-filter
// algorithms) and fits the workspace limit.
template <class Perf>
const Perf* pick(const Perf* perfs, int count) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = perfs[i];
    if (p.status == CUDNN_STATUS_SUCCESS && p.determinism == CUDNN_DETERMINISTIC &&
        p.memory <= kConvWorkspaceLimit)
      return &p;
  }
  return nullptr;
}

}  // namespace

struct ConvPlans::Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  bool have_fwd = false, have_bwd_data = false, have_bwd_filter = false;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  cudnnMathType_t fwd_math{}, bwd_data_math{}, bwd_filter_math{};
  std::size_t fwd_bytes = 0, bwd_data_bytes = 0, bwd_filter_bytes = 0;

  ~Plan() {
    if (conv) dyn::cudnnDestroyConvolutionDescriptor(conv);
    if (w) dyn::cudnnDestroyFilterDescriptor(w);
    if (y) dyn::cudnnDestroyTensorDescriptor(y);
    if (x) dyn::cudnnDestroyTensorDescriptor(x);
  }
};

ConvPlans::ConvPlans(cudnnHandle_t handle, Device device) : handle_(handle), device_(device) {}

ConvPlans::~ConvPlans() = default;

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
          static_cast<std::int64_t>(precision)};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnCreateTensorDescriptor(&plan->x));
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnCreateTensorDescriptor(&plan->y));
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnCreateFilterDescriptor(&plan->w));
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnCreateConvolutionDescriptor(&plan->conv));
  const cudnnDataType_t data =
      precision == Precision::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  set_tensor(plan->x, x, data);
  set_tensor(plan->y, y, data);
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnSetFilter4dDescriptor(plan->w, data, CUDNN_TENSOR_NCHW,
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
  if (!plan.have_fwd) {
    cudnnConvolutionFwdAlgoPerf_t perfs[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    LOCKSTEP_CHECK_CUDNN(
        dyn::cudnnFindConvolutionForwardAlgorithm(handle_, plan.x, plan.w, plan.conv, plan.y,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perfs));
    const auto* best = pick(perfs, count);
    LOCKSTEP_CHECK(best, "no deterministic cuDNN forward algorithm for convolution of ",
                   x.describe(), " with ", w.describe(), " within ", kConvWorkspaceLimit >> 20,
                   " MiB of workspace");
    plan.fwd = best->algo;
    plan.fwd_math = best->mathType;
    plan.fwd_bytes = best->memory;
    plan.have_fwd = true;
  }
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnSetConvolutionMathType(plan.conv, plan.fwd_math));
  Tensor ws = workspace(plan.fwd_bytes);
  const float one = 1.0f, zero = 0.0f;
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnConvolutionForward(
      handle_, &one, plan.x, x.raw_data(), plan.w, w.raw_data(), plan.conv, plan.fwd,
      ws.defined() ? ws.raw_data() : nullptr, plan.fwd_bytes, &zero, plan.y, y.raw_data()));
}

void ConvPlans::backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const Conv2dParams& p,
                              Precision precision) {
  Plan& plan = plan_for(dx.shape(), w.shape(), dy.shape(), p, precision);
  if (!plan.have_bwd_data) {
    cudnnConvolutionBwdDataAlgoPerf_t perfs[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int count = 0;
    LOCKSTEP_CHECK_CUDNN(dyn::cudnnFindConvolutionBackwardDataAlgorithm(
        handle_, plan.w, plan.y, plan.conv, plan.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count,
        perfs));
    const auto* best = pick(perfs, count);
    LOCKSTEP_CHECK(best, "no deterministic cuDNN backward-data algorithm for convolution of ",
                   dx.describe(), " with ", w.describe(), " within ", kConvWorkspaceLimit >> 20,
                   " MiB of workspace");
    plan.bwd_data = best->algo;
    plan.bwd_data_math = best->mathType;
    plan.bwd_data_bytes = best->memory;
    plan.have_bwd_data = true;
  }
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnSetConvolutionMathType(plan.conv, plan.bwd_data_math));
  Tensor ws = workspace(plan.bwd_data_bytes);
  const float one = 1.0f, zero = 0.0f;
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnConvolutionBackwardData(
      handle_, &one, plan.w, w.raw_data(), plan.y, dy.raw_data(), plan.conv, plan.bwd_data,
      ws.defined() ? ws.raw_data() : nullptr, plan.bwd_data_bytes, &zero, plan.x, dx.raw_data()));
}

void ConvPlans::backward_filter(const Tensor& x, const Tensor& dy, Tensor& dw,
                                const Conv2dParams& p, Precision precision, bool accumulate) {
  Plan& plan = plan_for(x.shape(), dw.shape(), dy.shape(), p, precision);
  if (!plan.have_bwd_filter) {
    cudnnConvolutionBwdFilterAlgoPerf_t perfs[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    LOCKSTEP_CHECK_CUDNN(dyn::cudnnFindConvolutionBackwardFilterAlgorithm(
        handle_, plan.x, plan.y, plan.conv, plan.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count,
        perfs));
    const auto* best = pick(perfs, count);
    LOCKSTEP_CHECK(best, "no deterministic cuDNN backward-filter algorithm for convolution of ",
                   x.describe(), " with ", dw.describe(), " within ", kConvWorkspaceLimit >> 20,
                   " MiB of workspace");
    plan.bwd_filter = best->algo;
    plan.bwd_filter_math = best->mathType;
    plan.bwd_filter_bytes = best->memory;
    plan.have_bwd_filter = true;
  }
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnSetConvolutionMathType(plan.conv, plan.bwd_filter_math));
  Tensor ws = workspace(plan.bwd_filter_bytes);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;  // parameter gradients accumulate
  LOCKSTEP_CHECK_CUDNN(dyn::cudnnConvolutionBackwardFilter(
      handle_, &one, plan.x, x.raw_data(), plan.y, dy.raw_data(), plan.conv, plan.bwd_filter,
      ws.defined() ? ws.raw_data() : nullptr, plan.bwd_filter_bytes, &beta, plan.w, dw.raw_data()));
}

}  // namespace lockstep::ops::cuda
