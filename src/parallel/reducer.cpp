#include "lockstep/parallel/reducer.hpp"

#include <chrono>

#include "lockstep/core/error.hpp"
#include "lockstep/core/trace.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::parallel {

optim::BucketLimits bucket_limits(const ReducerOptions& options) {
  return {options.bucket_bytes, options.first_bucket_bytes};
}

DType parse_grad_dtype(const std::string& value, const std::string& key) {
  if (value == "fp32") return DType::F32;
  if (value == "bf16") return DType::BF16;
  LOCKSTEP_FAIL_HINT("use fp32 or bf16", "key ", key, " = '", value,
                     "' is not a gradient dtype (fp32 | bf16)");
}

Reducer::Reducer(ops::Context& ctx, comm::Communicator& comm,
                 std::shared_ptr<optim::FlatParams> flat, optim::FlatShard shard, DType grad_dtype)
    : ctx_(ctx),
      comm_(comm),
      flat_(std::move(flat)),
      shard_(std::move(shard)),
      grad_dtype_(grad_dtype) {
  LOCKSTEP_CHECK(grad_dtype_ == DType::F32 || grad_dtype_ == DType::BF16,
                 "reducer: gradients travel as f32 or bf16, not ", dtype_name(grad_dtype_));
  LOCKSTEP_CHECK(flat_ != nullptr, "reducer: no parameters (null FlatParams)");
  LOCKSTEP_CHECK(flat_->device() == ctx_.device(), "reducer: the gradients are on ",
                 flat_->device().str(), " but the context runs on ", ctx_.device().str());
  if (shard_.ranges.empty()) shard_ = flat_->shard(0, 1);
  LOCKSTEP_CHECK(!shard_.sharded() || (shard_.count == comm_.size() && shard_.rank == comm_.rank()),
                 "reducer: shard ", shard_.rank, " of ", shard_.count, " on rank ", comm_.rank(),
                 " of ", comm_.size());
  if (shard_.sharded()) shard_grads_ = flat_->zeros(shard_.numel);
  const auto& buckets = flat_->layout().buckets();
  bucket_of_param_.assign(flat_->parameters().size(), 0);
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    bucket_tensors_.push_back(flat_->grad_bucket(b));
    for (std::size_t k : buckets[b].params)
      bucket_of_param_[k] = b;
  }
  // Only a reducer that communicates needs the bf16 copies (no memory for one rank).
  if (grad_dtype_ == DType::BF16 && comm_.size() > 1) {
    for (const Tensor& bucket : bucket_tensors_)
      wire_buckets_.push_back(Tensor::empty({bucket.numel()}, DType::BF16, flat_->device()));
    if (shard_.sharded()) wire_shard_ = Tensor::empty({shard_.numel}, DType::BF16, flat_->device());
  }
  pending_.assign(buckets.size(), 0);
  ready_.assign(flat_->parameters().size(), false);
  work_.resize(buckets.size());
}

Reducer::Reducer(ops::Context& ctx, comm::Communicator& comm, std::vector<nn::Parameter*> params,
                 ReducerOptions options)
    : Reducer(ctx, comm,
              std::make_shared<optim::FlatParams>(std::move(params), bucket_limits(options)), {},
              options.grad_dtype) {}

void Reducer::prepare_for_backward(bool communicate) {
  LOCKSTEP_CHECK(!in_backward_ || !communicate_,
                 "reducer: a new backward started before finish() of the previous one");
  communicate_ = communicate;
  in_backward_ = true;
  next_to_launch_ = 0;
  for (std::size_t b = 0; b < buckets().size(); ++b)
    pending_[b] = static_cast<int>(buckets()[b].params.size());
  std::fill(ready_.begin(), ready_.end(), false);
}

void Reducer::on_grad_ready(nn::Parameter& param) {
  if (!in_backward_) return;  // e.g. a backward outside training (gradient checks)
  const auto& params = flat_->parameters();
  std::size_t k = 0;
  // Parameters are few (tens to hundreds): a linear search keeps the hook allocation-free.
  while (k < params.size() && params[k] != &param)
    ++k;
  LOCKSTEP_CHECK(k < params.size(), "reducer: gradient of unknown parameter ", param.name);
  LOCKSTEP_CHECK(!ready_[k], "reducer: gradient of ", param.name,
                 " marked ready twice in one backward (a layer used twice?)");
  ready_[k] = true;
  --pending_[bucket_of_param_[k]];
  if (communicate_) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_to_launch_ < buckets().size() && pending_[next_to_launch_] == 0) {
    // Compute on a device stream must be complete before the communicator reads the bucket;
    // the communicator orders this itself (NCCL: an event on the compute stream).
    const std::size_t b = next_to_launch_;
    const bool bf16 = !wire_buckets_.empty();
    if (bf16) ops::cast(ctx_, bucket_tensors_[b], wire_buckets_[b]);
    const Tensor& send = bf16 ? wire_buckets_[b] : bucket_tensors_[b];
    // Its collective is the communication track's next one (lockstep-trace pairs them in order).
    if (trace::on()) trace::instant("buckets", str("bucket ", b, " ready, ", send.nbytes(), " B"));
    if (shard_.sharded()) {
      const ops::FlatRange& r = shard_.ranges[b];
      const Tensor& results = bf16 ? wire_shard_ : shard_grads_;
      work_[b] =
          comm_.reduce_scatter_async(send, results.sub(shard_.offsets[b], {r.end - r.begin}));
    } else {
      work_[b] = comm_.allreduce_async(send);
    }
    ++next_to_launch_;
  }
}

double Reducer::finish() {
  LOCKSTEP_CHECK(in_backward_, "reducer: finish() without a backward");
  std::string missing;
  for (std::size_t k = 0; k < ready_.size(); ++k)
    if (!ready_[k]) {
      if (!missing.empty()) missing += ", ";
      missing += flat_->parameters()[k]->name;
    }
  LOCKSTEP_CHECK_HINT(missing.empty(), "every parameter must take part in the loss",
                      "reducer: no gradient arrived for ", missing);
  in_backward_ = false;
  if (!communicate_) return 0.0;
  auto start = std::chrono::steady_clock::now();
  for (std::size_t b = 0; b < buckets().size(); ++b) {
    work_[b]->wait();
    work_[b].reset();
  }
  if (!wire_buckets_.empty()) {  // back to f32 (exact), where the optimizer reads them
    if (shard_.sharded()) {
      ops::cast(ctx_, wire_shard_, shard_grads_);
    } else {
      for (std::size_t b = 0; b < buckets().size(); ++b)
        ops::cast(ctx_, wire_buckets_[b], bucket_tensors_[b]);
    }
  }
  if (shard_.sharded()) {
    // The average of the shard (unless the loss gradient was prescaled by 1/world, see
    // ddp.cpp), then into its place in the flat gradients (the fused ops and the gradient check
    // read it there).
    if (!prescaled_) ops::scale(ctx_, shard_grads_, 1.0f / static_cast<float>(comm_.size()));
    for (std::size_t b = 0; b < shard_.ranges.size(); ++b) {
      const ops::FlatRange& r = shard_.ranges[b];
      Tensor to = flat_->grads().sub(r.begin, {r.end - r.begin});
      ops::copy(ctx_, shard_grads_.sub(shard_.offsets[b], {r.end - r.begin}), to);
    }
  } else if (comm_.size() > 1 && !prescaled_) {
    // One op over the whole buffer (the padding is zero and stays zero).
    ops::scale(ctx_, flat_->grads(), 1.0f / static_cast<float>(comm_.size()));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Reducer::zero_grad() {
  flat_->zero_grad(ctx_);
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

void broadcast_state(comm::Communicator& comm, optim::FlatParams& flat,
                     const std::vector<nn::Buffer*>& buffers) {
  if (comm.size() == 1) return;
  std::vector<comm::WorkPtr> work;
  for (std::size_t b = 0; b < flat.layout().buckets().size(); ++b) {
    Tensor bucket = flat.value_bucket(b);
    work.push_back(comm.broadcast_async(bucket, 0));
  }
  for (nn::Buffer* buffer : buffers)
    work.push_back(comm.broadcast_async(buffer->value, 0));
  for (auto& w : work)
    w->wait();
}

}  // namespace lockstep::parallel
