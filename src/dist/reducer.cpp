#include "lockstep/dist/reducer.hpp"

#include <chrono>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::dist {

std::vector<BucketLayout> assign_buckets(const std::vector<nn::Parameter*>& params,
                                         const ReducerOptions& options) {
  std::vector<BucketLayout> out;
  std::size_t bytes = 0;
  for (std::size_t k = params.size(); k-- > 0;) {
    // The current bucket is out.back(); bucket 0 has the smaller first-bucket limit.
    std::size_t limit = out.size() == 1 ? options.first_bucket_bytes : options.bucket_bytes;
    if (out.empty() || bytes >= limit) {
      out.emplace_back();
      bytes = 0;
    }
    out.back().params.push_back(k);
    out.back().numel += params[k]->value.numel();
    bytes += static_cast<std::size_t>(params[k]->value.numel()) * sizeof(float);
  }
  return out;
}

Reducer::Reducer(ops::Context& ctx, comm::Communicator& comm, std::vector<nn::Parameter*> params,
                 ReducerOptions options)
    : ctx_(ctx), comm_(comm), params_(std::move(params)) {
  for (const nn::Parameter* p : params_)
    LOCKSTEP_CHECK(p->value.dtype() == DType::F32, "reducer: parameter ", p->name, " is ",
                   p->value.describe(), "; only f32 gradients are bucketed");
  layout_ = assign_buckets(params_, options);
  bucket_of_param_.assign(params_.size(), 0);
  for (std::size_t b = 0; b < layout_.size(); ++b) {
    Tensor bucket = Tensor::empty({layout_[b].numel}, DType::F32, ctx_.device());
    ops::fill(ctx_, bucket, 0.0f);
    std::int64_t offset = 0;
    for (std::size_t k : layout_[b].params) {
      nn::Parameter& p = *params_[k];
      Tensor view = bucket.sub(offset, p.value.shape());
      if (p.grad.defined()) ops::copy(ctx_, p.grad, view);  // keep accumulated values
      p.grad = view;
      bucket_of_param_[k] = b;
      offset += p.value.numel();
    }
    bucket_tensors_.push_back(bucket);
  }
  pending_.assign(layout_.size(), 0);
  ready_.assign(params_.size(), false);
  work_.resize(layout_.size());
}

void Reducer::prepare_for_backward(bool communicate) {
  LOCKSTEP_CHECK(!in_backward_ || !communicate_,
                 "reducer: a new backward started before finish() of the previous one");
  communicate_ = communicate;
  in_backward_ = true;
  next_to_launch_ = 0;
  for (std::size_t b = 0; b < layout_.size(); ++b)
    pending_[b] = static_cast<int>(layout_[b].params.size());
  std::fill(ready_.begin(), ready_.end(), false);
}

void Reducer::on_grad_ready(nn::Parameter& param) {
  if (!in_backward_) return;  // e.g. a backward outside training (gradient checks)
  std::size_t k = 0;
  // Parameters are few (tens to hundreds): a linear search keeps the hook allocation-free.
  while (k < params_.size() && params_[k] != &param)
    ++k;
  LOCKSTEP_CHECK(k < params_.size(), "reducer: gradient of unknown parameter ", param.name);
  LOCKSTEP_CHECK(!ready_[k], "reducer: gradient of ", param.name,
                 " marked ready twice in one backward (a layer used twice?)");
  ready_[k] = true;
  --pending_[bucket_of_param_[k]];
  if (communicate_) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_to_launch_ < layout_.size() && pending_[next_to_launch_] == 0) {
    // Compute on a device stream must be complete before the communicator reads the bucket;
    // the communicator orders this itself (NCCL: an event on the compute stream).
    work_[next_to_launch_] = comm_.allreduce_async(bucket_tensors_[next_to_launch_]);
    ++next_to_launch_;
  }
}

double Reducer::finish() {
  LOCKSTEP_CHECK(in_backward_, "reducer: finish() without a backward");
  std::string missing;
  for (std::size_t k = 0; k < params_.size(); ++k)
    if (!ready_[k]) {
      if (!missing.empty()) missing += ", ";
      missing += params_[k]->name;
    }
  LOCKSTEP_CHECK_HINT(missing.empty(), "every parameter must take part in the loss",
                      "reducer: no gradient arrived for ", missing);
  in_backward_ = false;
  if (!communicate_) return 0.0;
  auto start = std::chrono::steady_clock::now();
  const float inv_world = 1.0f / static_cast<float>(comm_.size());
  for (std::size_t b = 0; b < layout_.size(); ++b) {
    work_[b]->wait();
    work_[b].reset();
    if (comm_.size() > 1) ops::scale(ctx_, bucket_tensors_[b], inv_world);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Reducer::zero_grad() {
  for (Tensor& bucket : bucket_tensors_)
    ops::fill(ctx_, bucket, 0.0f);
}

void broadcast_state(comm::Communicator& comm, const std::vector<nn::Parameter*>& params,
                     const std::vector<nn::Buffer*>& buffers) {
  if (comm.size() == 1) return;
  std::vector<comm::WorkPtr> work;
  for (nn::Parameter* p : params)
    work.push_back(comm.broadcast_async(p->value, 0));
  for (nn::Buffer* b : buffers)
    work.push_back(comm.broadcast_async(b->value, 0));
  for (auto& w : work)
    w->wait();
}

}  // namespace lockstep::dist
