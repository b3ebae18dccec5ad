// EmuBackend: the emulated GPU's ops (emu_runtime.hpp says what it emulates). Each op is queued
// on the context's compute stream and runs there on a CPU backend of its own, over host views of
// the device tensors, so every result is bitwise the CPU's. The closures hold borrowed views,
// never the tensors: as on a GPU, a tensor the host drops goes back to the cache at once and its
// block may serve the next op queued, which is safe only in stream order.
//
// The fused linear ops are the Backend's compositions over these queued ops (a GPU's fusions are
// its libraries', which an emulation would only imitate); the fused LayerNorm is the CPU's kernel.
//
// Ops that return a host value (count_correct, sum_squares, all_finite) and copies to the host
// wait for the compute stream, and count that wait, as the CUDA backend does. Parameter reuse
// windows (Context::begin_reuse) are not forwarded: the inner CPU backend converts bf16 operands
// afresh for every GEMM, which gives the same bits (cast_cache.hpp) and keeps the host's window
// bookkeeping away from the worker thread.
#include <memory>

#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/device_runtime.hpp"
#include "ops/emu/emu_runtime.hpp"

namespace lockstep::ops {
namespace emu {
namespace {

// What the kernels are given: host views of the device tensors (emu_runtime.hpp).
Tensor view(const Tensor& t) {
  return host_view(t);
}
BatchNormEpilogue view(const BatchNormEpilogue& e) {
  return {e.residual.defined() ? view(e.residual) : Tensor(), e.relu};
}

// A flat plan of this device over the CPU's plan, which the kernels are given.
class EmuFlatPlan final : public FlatPlan {
 public:
  EmuFlatPlan(std::shared_ptr<const FlatPlan> cpu, Device device)
      : FlatPlan(cpu->segments(), cpu->numel(), device), cpu_(std::move(cpu)) {}
  const FlatPlan& cpu() const { return *cpu_; }

 private:
  std::shared_ptr<const FlatPlan> cpu_;
};

const FlatPlan& cpu_plan(const FlatPlan& plan) {
  return static_cast<const EmuFlatPlan&>(plan).cpu();
}

class EmuBackend final : public Backend {
 public:
  explicit EmuBackend(Context& ctx)
      : ctx_(ctx),
        device_(ctx.device()),
        inner_(std::make_unique<Context>(Device::cpu(), ctx.threads())),
        compute_(std::make_unique<Stream>(device_.index, "compute stream of " + device_.str())),
        runtime_(make_runtime(*compute_)) {
    register_hooks();
  }

  ~EmuBackend() override {
    // Queued kernels reference the inner context: the stream runs them before it goes (and prints
    // an error nobody waited for), then the inner context goes.
    runtime_.reset();
    compute_.reset();
  }

  DeviceRuntime* runtime() override { return runtime_.get(); }

  void synchronize() override {
    note_host_sync();
    compute_->synchronize();
  }

  // ---- memory
  void fill(Tensor& t, float value) override {
    launch([t = view(t), value](Backend& b) mutable { b.fill(t, value); });
  }

  void copy(const Tensor& src, Tensor& dst) override {
    // Devices only through the compute stream; to the host the caller reads next, so wait.
    copy_async(dst.raw_data(), src.raw_data(), src.nbytes(), *compute_);
  }

  void batch_transpose(const Tensor& x, Tensor& y) override {
    launch([x = view(x), y = view(y)](Backend& b) mutable { b.batch_transpose(x, y); });
  }

  void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b, float beta,
            Tensor& c) override {
    launch([=, a = view(a), b = view(b), c = view(c)](Backend& k) mutable {
      k.gemm(trans_a, trans_b, alpha, a, b, beta, c);
    });
  }
  void gemm_leading(std::int64_t k, float alpha, const Tensor& a, const Tensor& b, float beta,
                    Tensor& c) override {
    launch([=, a = view(a), b = view(b), c = view(c)](Backend& kernels) mutable {
      kernels.gemm_leading(k, alpha, a, b, beta, c);
    });
  }
  void add_row_bias(Tensor& y, const Tensor& bias) override {
    launch([y = view(y), bias = view(bias)](Backend& b) mutable { b.add_row_bias(y, bias); });
  }
  void sum_rows(const Tensor& dy, Tensor& db) override {
    launch([dy = view(dy), db = view(db)](Backend& b) mutable { b.sum_rows(dy, db); });
  }

  void relu_forward(const Tensor& x, Tensor& y) override {
    launch([x = view(x), y = view(y)](Backend& b) mutable { b.relu_forward(x, y); });
  }
  void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override {
    launch([y = view(y), dy = view(dy), dx = view(dx)](Backend& b) mutable {
      b.relu_backward(y, dy, dx);
    });
  }
  void gelu_forward(const Tensor& x, Tensor& y) override {
    launch([x = view(x), y = view(y)](Backend& b) mutable { b.gelu_forward(x, y); });
  }
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    launch([x = view(x), dy = view(dy), dx = view(dx)](Backend& b) mutable {
      b.gelu_backward(x, dy, dx);
    });
  }
  void add(const Tensor& a, const Tensor& b, Tensor& out) override {
    launch([a = view(a), b = view(b), out = view(out)](Backend& k) mutable { k.add(a, b, out); });
  }
  void axpy(float alpha, const Tensor& x, Tensor& y) override {
    launch([alpha, x = view(x), y = view(y)](Backend& b) mutable { b.axpy(alpha, x, y); });
  }
  void scale(Tensor& x, float alpha) override {
    launch([x = view(x), alpha](Backend& b) mutable { b.scale(x, alpha); });
  }
  void dropout_forward(const Tensor& x, Tensor& y, Tensor& mask, float p, std::uint64_t seed,
                       std::uint64_t stream) override {
    launch([=, x = view(x), y = view(y), mask = view(mask)](Backend& b) mutable {
      b.dropout_forward(x, y, mask, p, seed, stream);
    });
  }
  void dropout_backward(const Tensor& dy, const Tensor& mask, float p, Tensor& dx) override {
    launch([=, dy = view(dy), mask = view(mask), dx = view(dx)](Backend& b) mutable {
      b.dropout_backward(dy, mask, p, dx);
    });
  }
  void normalize_input(const Tensor& x, const std::vector<float>& mean,
                       const std::vector<float>& stddev, Tensor& y) override {
    launch([x = view(x), mean, stddev, y = view(y)](Backend& b) mutable {
      b.normalize_input(x, mean, stddev, y);
    });
  }

  void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y,
                      const Conv2dParams& p) override {
    launch([=, x = view(x), w = view(w), bias = view(bias), y = view(y)](Backend& b) mutable {
      b.conv2d_forward(x, w, bias, y, p);
    });
  }
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx,
                            const Conv2dParams& p) override {
    launch([=, dy = view(dy), w = view(w), dx = view(dx)](Backend& b) mutable {
      b.conv2d_backward_data(dy, w, dx, p);
    });
  }
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& db,
                               const Conv2dParams& p) override {
    launch([=, x = view(x), dy = view(dy), dw = view(dw), db = view(db)](Backend& b) mutable {
      b.conv2d_backward_weights(x, dy, dw, db, p);
    });
  }
  void pool2d_forward(PoolKind kind, const Tensor& x, Tensor& y, Tensor& workspace,
                      const Pool2dParams& p) override {
    // Max pooling's argmax lives on the device, as the CUDA backend's; the CPU kernel then finds
    // a workspace of the right kind in the view and keeps it.
    if (kind == PoolKind::Max && (!workspace.defined() || workspace.dtype() != DType::I32 ||
                                  workspace.shape() != y.shape() || workspace.device() != device_))
      workspace = Tensor::empty(y.shape(), DType::I32, device_);
    launch([=, x = view(x), y = view(y), ws = view(workspace)](Backend& b) mutable {
      b.pool2d_forward(kind, x, y, ws, p);
    });
  }
  void pool2d_backward(PoolKind kind, const Tensor& dy, const Tensor& workspace, Tensor& dx,
                       const Pool2dParams& p) override {
    launch([=, dy = view(dy), ws = view(workspace), dx = view(dx)](Backend& b) mutable {
      b.pool2d_backward(kind, dy, ws, dx, p);
    });
  }

  void batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                               Tensor& save_mean, Tensor& save_invstd, Tensor& running_mean,
                               Tensor& running_var, float momentum, float eps) override {
    launch([=, x = view(x), gamma = view(gamma), beta = view(beta), y = view(y),
            save_mean = view(save_mean), save_invstd = view(save_invstd),
            running_mean = view(running_mean),
            running_var = view(running_var)](Backend& b) mutable {
      b.batchnorm_forward_train(x, gamma, beta, y, save_mean, save_invstd, running_mean,
                                running_var, momentum, eps);
    });
  }
  void batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              const Tensor& running_mean, const Tensor& running_var, float eps,
                              Tensor& y) override {
    launch([=, x = view(x), gamma = view(gamma), beta = view(beta),
            running_mean = view(running_mean), running_var = view(running_var),
            y = view(y)](Backend& b) mutable {
      b.batchnorm_forward_eval(x, gamma, beta, running_mean, running_var, eps, y);
    });
  }
  void batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx,
                          Tensor& dgamma, Tensor& dbeta) override {
    launch([x = view(x), dy = view(dy), gamma = view(gamma), save_mean = view(save_mean),
            save_invstd = view(save_invstd), dx = view(dx), dgamma = view(dgamma),
            dbeta = view(dbeta)](Backend& b) mutable {
      b.batchnorm_backward(x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
    });
  }

  void softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& probs, Tensor& loss,
                            float label_smoothing) override {
    launch([logits = view(logits), labels = view(labels), probs = view(probs), loss = view(loss),
            label_smoothing](Backend& b) mutable {
      b.softmax_xent_forward(logits, labels, probs, loss, label_smoothing);
    });
  }
  void softmax_xent_backward(const Tensor& probs, const Tensor& labels, float scale,
                             Tensor& dlogits, float label_smoothing) override {
    launch([probs = view(probs), labels = view(labels), scale, dlogits = view(dlogits),
            label_smoothing](Backend& b) mutable {
      b.softmax_xent_backward(probs, labels, scale, dlogits, label_smoothing);
    });
  }
  void softmax_xent_chunk(Tensor& logits, const Tensor& labels, std::int64_t first_row,
                          std::int64_t classes, float scale, Tensor& row_loss,
                          float label_smoothing) override {
    launch([=, logits = view(logits), labels = view(labels),
            row_loss = view(row_loss)](Backend& b) mutable {
      b.softmax_xent_chunk(logits, labels, first_row, classes, scale, row_loss, label_smoothing);
    });
  }
  void mean_row_loss(const Tensor& row_loss, Tensor& loss) override {
    launch([row_loss = view(row_loss), loss = view(loss)](Backend& b) mutable {
      b.mean_row_loss(row_loss, loss);
    });
  }
  std::int64_t count_correct(const Tensor& logits, const Tensor& labels) override {
    return result<std::int64_t>([logits = view(logits), labels = view(labels)](Backend& b) {
      return b.count_correct(logits, labels);
    });
  }

  double sum_squares(const Tensor& x) override {
    return result<double>([x = view(x)](Backend& b) { return b.sum_squares(x); });
  }
  bool all_finite(const Tensor& x) override {
    return result<bool>([x = view(x)](Backend& b) { return b.all_finite(x); });
  }

  void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf,
                  const SgdParams& p) override {
    launch([=, param = view(param), grad = view(grad),
            buf = view(momentum_buf)](Backend& b) mutable { b.sgd_update(param, grad, buf, p); });
  }
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                    const AdamWParams& p) override {
    launch([=, param = view(param), grad = view(grad), m = view(m),
            v = view(v)](Backend& b) mutable { b.adamw_update(param, grad, m, v, p); });
  }

  // A plan is host bookkeeping (chunks and their decay flags), made once: the CPU's serves, and
  // the plan handed out says it is this device's (ops.cpp checks that).
  std::shared_ptr<const FlatPlan> make_flat_plan(std::vector<FlatSegment> segments,
                                                 std::int64_t numel) override {
    return std::make_shared<EmuFlatPlan>(
        inner_->backend().make_flat_plan(std::move(segments), numel), device_);
  }
  void flat_sgd_update(const FlatPlan& plan, FlatRange range, Tensor& param, const Tensor& grad,
                       Tensor& momentum_buf, std::int64_t state_origin,
                       const SgdParams& p) override {
    SgdParams q = p;
    q.verdict = view(p.verdict);
    launch([=, &plan = cpu_plan(plan), param = view(param), grad = view(grad),
            buf = view(momentum_buf)](Backend& b) mutable {
      b.flat_sgd_update(plan, range, param, grad, buf, state_origin, q);
    });
  }
  void flat_adamw_update(const FlatPlan& plan, FlatRange range, Tensor& param, const Tensor& grad,
                         Tensor& m, Tensor& v, std::int64_t state_origin,
                         const AdamWParams& p) override {
    AdamWParams q = p;
    q.verdict = view(p.verdict);
    launch([=, &plan = cpu_plan(plan), param = view(param), grad = view(grad), m = view(m),
            v = view(v)](Backend& b) mutable {
      b.flat_adamw_update(plan, range, param, grad, m, v, state_origin, q);
    });
  }
  void flat_sum_squares(const FlatPlan& plan, FlatRange range, const Tensor& x, Tensor& sums,
                        FlatSums what) override {
    launch([=, &plan = cpu_plan(plan), x = view(x), sums = view(sums)](Backend& b) mutable {
      b.flat_sum_squares(plan, range, x, sums, what);
    });
  }
  void verdict_add(const Tensor& total, Tensor& verdict, bool first) override {
    launch([=, total = view(total), verdict = view(verdict)](Backend& b) mutable {
      b.verdict_add(total, verdict, first);
    });
  }
  void verdict_close(Tensor& verdict, std::int64_t taken) override {
    launch([=, verdict = view(verdict)](Backend& b) mutable { b.verdict_close(verdict, taken); });
  }
  void clip_by_verdict(Tensor& x, const Tensor& verdict, double max_norm) override {
    launch([=, x = view(x), verdict = view(verdict)](Backend& b) mutable {
      b.clip_by_verdict(x, verdict, max_norm);
    });
  }

  // The CPU's arithmetic: bf16 where this CPU has it, tf32 is exactly fp32 as on the CPU.
  void check_precision(Precision p) override { inner_->backend().check_precision(p); }
  std::string precision_info(Precision p) override {
    return "emulated GPU " + device_.str() +
           ", the CPU's kernels: " + inner_->backend().precision_info(p);
  }
  void cast(const Tensor& src, Tensor& dst) override {
    launch([src = view(src), dst = view(dst)](Backend& b) mutable { b.cast(src, dst); });
  }

  void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                         Tensor& y) override {
    launch([tokens = view(tokens), wte = view(wte), wpe = view(wpe),
            y = view(y)](Backend& b) mutable { b.embedding_forward(tokens, wte, wpe, y); });
  }
  void embedding_backward(const Tensor& tokens, const Tensor& dy, Tensor& dwte,
                          Tensor& dwpe) override {
    launch([tokens = view(tokens), dy = view(dy), dwte = view(dwte), dwpe = view(dwpe)](
               Backend& b) mutable { b.embedding_backward(tokens, dy, dwte, dwpe); });
  }
  void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                         Tensor& y, Tensor& mean, Tensor& rstd) override {
    launch([=, x = view(x), weight = view(weight), bias = view(bias), y = view(y),
            mean = view(mean), rstd = view(rstd)](Backend& b) mutable {
      b.layernorm_forward(x, weight, bias, eps, y, mean, rstd);
    });
  }
  void layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                          Tensor& dx, Tensor& dweight, Tensor& dbias) override {
    launch([x = view(x), dy = view(dy), weight = view(weight), mean = view(mean), rstd = view(rstd),
            dresidual = view(dresidual), dx = view(dx), dweight = view(dweight),
            dbias = view(dbias)](Backend& b) mutable {
      b.layernorm_backward(x, dy, weight, mean, rstd, dresidual, dx, dweight, dbias);
    });
  }
  void residual_layernorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                                  const Tensor& bias, float eps, Tensor& s, Tensor& y, Tensor& mean,
                                  Tensor& rstd) override {
    launch([=, x = view(x), a = view(a), weight = view(weight), bias = view(bias), s = view(s),
            y = view(y), mean = view(mean), rstd = view(rstd)](Backend& b) mutable {
      b.residual_layernorm_forward(x, a, weight, bias, eps, s, y, mean, rstd);
    });
  }
  // The fused BatchNorm epilogues are the CPU's kernels too (bitwise their compositions).
  void batchnorm_act_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   const BatchNormEpilogue& epilogue, Tensor& y, Tensor& save_mean,
                                   Tensor& save_invstd, Tensor& running_mean, Tensor& running_var,
                                   float momentum, float eps) override {
    launch([=, x = view(x), gamma = view(gamma), beta = view(beta), epi = view(epilogue),
            y = view(y), save_mean = view(save_mean), save_invstd = view(save_invstd),
            running_mean = view(running_mean),
            running_var = view(running_var)](Backend& b) mutable {
      b.batchnorm_act_forward_train(x, gamma, beta, epi, y, save_mean, save_invstd, running_mean,
                                    running_var, momentum, eps);
    });
  }
  void batchnorm_act_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& running_mean, const Tensor& running_var, float eps,
                                  const BatchNormEpilogue& epilogue, Tensor& y) override {
    launch([=, x = view(x), gamma = view(gamma), beta = view(beta),
            running_mean = view(running_mean), running_var = view(running_var),
            epi = view(epilogue), y = view(y)](Backend& b) mutable {
      b.batchnorm_act_forward_eval(x, gamma, beta, running_mean, running_var, eps, epi, y);
    });
  }
  void batchnorm_relu_backward(const Tensor& x, const Tensor& y, const Tensor& dy,
                               const Tensor& gamma, const Tensor& save_mean,
                               const Tensor& save_invstd, Tensor& dx, Tensor& dgamma,
                               Tensor& dbeta) override {
    launch([x = view(x), y = view(y), dy = view(dy), gamma = view(gamma),
            save_mean = view(save_mean), save_invstd = view(save_invstd), dx = view(dx),
            dgamma = view(dgamma), dbeta = view(dbeta)](Backend& b) mutable {
      b.batchnorm_relu_backward(x, y, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
    });
  }
  void gelu_tanh_forward(const Tensor& x, Tensor& y) override {
    launch([x = view(x), y = view(y)](Backend& b) mutable { b.gelu_tanh_forward(x, y); });
  }
  void gelu_tanh_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    launch([x = view(x), dy = view(dy), dx = view(dx)](Backend& b) mutable {
      b.gelu_tanh_backward(x, dy, dx);
    });
  }
  void attention_forward(const Tensor& qkv, int heads, Tensor& out, Tensor& lse,
                         AttentionKernel kernel) override {
    launch([=, qkv = view(qkv), out = view(out), lse = view(lse)](Backend& b) mutable {
      b.attention_forward(qkv, heads, out, lse, kernel);
    });
  }
  void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                          const Tensor& lse, int heads, Tensor& dqkv,
                          AttentionKernel kernel) override {
    launch([=, qkv = view(qkv), out = view(out), dout = view(dout), lse = view(lse),
            dqkv = view(dqkv)](Backend& b) mutable {
      b.attention_backward(qkv, out, dout, lse, heads, dqkv, kernel);
    });
  }

 private:
  // Queues a kernel on the compute stream, with the precision the context has now.
  template <class F>
  void launch(F kernel) {
    compute_->enqueue([this, precision = ctx_.precision(), kernel = std::move(kernel)]() mutable {
      if (inner_->precision() != precision) inner_->set_precision(precision);
      kernel(inner_->backend());
    });
  }

  // Queues a kernel that yields a host value and waits for it.
  template <class T, class F>
  T result(F kernel) {
    auto out = std::make_shared<T>();
    launch([out, kernel = std::move(kernel)](Backend& b) mutable { *out = kernel(b); });
    synchronize();
    return *out;
  }

  Context& ctx_;
  const Device device_;
  std::unique_ptr<Context> inner_;  // a CPU context, used only on the compute stream's worker
  std::unique_ptr<Stream> compute_;
  std::unique_ptr<DeviceRuntime> runtime_;
};

}  // namespace
}  // namespace emu

std::unique_ptr<Backend> make_emu_backend(Context& ctx) {
  return std::make_unique<emu::EmuBackend>(ctx);
}

}  // namespace lockstep::ops
