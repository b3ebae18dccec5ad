#include "lockstep/parallel/data_parallel.hpp"

#include <chrono>

#include "lockstep/core/clock.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::parallel {

DataParallelEngine::DataParallelEngine(ops::Context& master_ctx, nn::Model& master,
                                       DataParallelOptions options,
                                       std::shared_ptr<optim::FlatParams> flat)
    : master_ctx_(master_ctx),
      master_(master),
      options_(std::move(options)),
      threads_(options_.replicas) {
  LOCKSTEP_CHECK(options_.replicas >= 1, "train.replicas must be at least 1, got ",
                 options_.replicas);
  LOCKSTEP_CHECK(
      options_.devices.empty() || static_cast<int>(options_.devices.size()) == options_.replicas,
      "DataParallel: ", options_.devices.size(), " devices for ", options_.replicas, " replicas");
  replicas_.resize(static_cast<std::size_t>(options_.replicas));
  for (Replica& r : replicas_)
    r.loss = nn::SoftmaxCrossEntropy::for_training(master_, options_.label_smoothing);
  if (!flat) flat = std::make_shared<optim::FlatParams>(master_.parameters());
  LOCKSTEP_CHECK(flat->parameters() == master_.parameters(),
                 "DataParallel: the flat parameters given are not the master model's");
  replicas_[0].ctx = &master_ctx_;
  replicas_[0].model = &master_;
  replicas_[0].flat = std::move(flat);
  for (std::size_t r = 1; r < replicas_.size(); ++r) {
    Device device = options_.devices.empty() ? Device::cpu() : options_.devices[r];
    replicas_[r].own = std::make_unique<ops::Context>(device, options_.threads_per_replica);
    replicas_[r].own->set_precision(master_ctx_.precision());  // one policy for all replicas
    replicas_[r].ctx = replicas_[r].own.get();
    replicas_[r].own_model = std::make_unique<nn::Model>(master_.clone(device));
    replicas_[r].model = replicas_[r].own_model.get();
    replicas_[r].flat = std::make_shared<optim::FlatParams>(replicas_[r].model->parameters(),
                                                            replicas_[0].flat->limits());
  }
  copy_master_to_replicas();
}

DataParallelEngine::~DataParallelEngine() = default;

void DataParallelEngine::copy_master_to_replicas() {
  const auto& mb = master_.buffers();
  for (std::size_t r = 1; r < replicas_.size(); ++r) {
    ops::Context& replica = *replicas_[r].ctx;
    const auto& rb = replicas_[r].model->buffers();
    // The copies run on the master's stream; on GPUs each context has its own, so without these
    // two waits the replica could overwrite-while-reading its old weights or run its forward on
    // them before the fresh ones land.
    master_ctx_.wait_for(replica);
    // Clones, same limits: the same layout, so the whole parameter buffer is one copy.
    ops::copy(master_ctx_, replicas_[0].flat->values(), replicas_[r].flat->values());
    for (std::size_t i = 0; i < mb.size(); ++i)
      ops::copy(master_ctx_, mb[i]->value, rb[i]->value);
    replica.wait_for(master_ctx_);
  }
}

void DataParallelEngine::begin_step() {
  times_ = {};
  auto start = Clock::now();
  copy_master_to_replicas();  // replicate, as DataParallel does before every forward
  times_.param_copy += seconds_since(start);
  for (Replica& r : replicas_)
    r.flat->zero_grad(*r.ctx);
}

Tensor DataParallelEngine::forward_backward(const Tensor& x, const Tensor& y, float loss_scale,
                                            bool /*last_micro*/) {
  auto start = Clock::now();
  const std::int64_t n = x.dim(0);
  const auto k = static_cast<std::int64_t>(replicas_.size());
  LOCKSTEP_CHECK(n >= k, "DataParallel: a micro-batch of ", n, " samples cannot feed ", k,
                 " replicas");
  // Scatter: replica r takes rows [n*r/k, n*(r+1)/k), as torch's scatter splits the batch.
  threads_.run([&](int part, int) {
    Replica& r = replicas_[static_cast<std::size_t>(part)];
    std::int64_t begin = n * part / k, end = n * (part + 1) / k;
    Tensor xs = x.slice(begin, end), ys = y.slice(begin, end);
    prepare_input(*r.ctx, xs, options_.input, r.input);
    Tensor labels = ys.device() == r.ctx->device() ? ys : ys.to(r.ctx->device());
    Tensor loss = r.model->forward_loss(*r.ctx, r.input, labels, r.loss, loss_scale);
    r.model->backward_loss(*r.ctx);
    r.last_loss = loss.item() * static_cast<float>(end - begin);
  });
  float total = 0;
  for (const Replica& r : replicas_)
    total += r.last_loss;
  times_.compute += seconds_since(start);
  // The replicas' losses are read above (one per replica and micro-step): DataParallel is the
  // baseline, not the synchronisation-free path. Returned on the host; the trainer copies it.
  return Tensor::from_vector(std::vector<float>{total / static_cast<float>(n)}, {1});
}

void DataParallelEngine::finish_gradients() {
  auto start = Clock::now();
  Tensor& master_grads = replicas_[0].flat->grads();
  for (std::size_t r = 1; r < replicas_.size(); ++r) {
    // The sums run on the master's stream and read what the replica's backward wrote on its own.
    master_ctx_.wait_for(*replicas_[r].ctx);
    // Element by element the same sums, in the same replica order, as one axpy per parameter.
    const Tensor& grads = replicas_[r].flat->grads();
    if (grads.device() == master_grads.device()) {
      ops::axpy(master_ctx_, 1.0f, grads, master_grads);
    } else {
      // On the master's stream, after the wait (Tensor::to would copy outside both streams).
      Tensor staged = Tensor::empty(grads.shape(), grads.dtype(), master_grads.device());
      ops::copy(master_ctx_, grads, staged);
      ops::axpy(master_ctx_, 1.0f, staged, master_grads);
    }
  }
  times_.grad_gather += seconds_since(start);
}

std::vector<std::int64_t> DataParallelEngine::replica_tensor_bytes() const {
  std::vector<std::int64_t> out;
  for (const Replica& r : replicas_) {
    std::int64_t bytes = 0;
    for (const nn::Parameter* p : r.model->parameters())
      bytes += static_cast<std::int64_t>(p->value.nbytes() + p->grad.nbytes());
    for (const nn::Buffer* b : r.model->buffers())
      bytes += static_cast<std::int64_t>(b->value.nbytes());
    out.push_back(bytes);
  }
  return out;
}

}  // namespace lockstep::parallel
