// A GPT under the real Reducer at 2 and 4 ranks: the tied token table is used twice (LM head and
// embedding) but reported ready once, after both uses, so the bucket holding it is allreduced
// complete. Averaged gradients must equal one process's gradients on the whole batch.
//
// Tolerance: each gradient entry is a mean over B*T = 48 positions of terms of size <= ~0.1;
// summing it in N partial sums changes it by ~48 * 6e-8 * 0.1 ~ 3e-7. A bucket sent before the
// embedding's contribution arrived misses a term of the table's gradient: O(1e-3) or more.
#include <gtest/gtest.h>

#include "lockstep/core/rng.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/parallel/reducer.hpp"
#include "support/mpi_env.hpp"

namespace lockstep::test {
namespace {

constexpr std::int64_t kBatch = 4, kSeq = 12, kVocab = 23;
constexpr const char* kSpec = "gpt(layers=2,heads=2,dim=16)";

Tensor batch_tokens(std::uint64_t stream) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(kBatch * (kSeq + 1)));
  Philox rng(99, stream);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<std::int32_t>(rng.u32(i) % kVocab);
  return Tensor::from_vector(v, {kBatch, kSeq + 1});
}

// Sequences [begin, end) of the batch: inputs are the first kSeq tokens, labels the next ones.
void window(const Tensor& all, std::int64_t begin, std::int64_t end, Tensor& x, Tensor& y) {
  auto v = all.to_vector<std::int32_t>();
  std::vector<std::int32_t> xs, ys;
  for (std::int64_t b = begin; b < end; ++b)
    for (std::int64_t t = 0; t < kSeq; ++t) {
      xs.push_back(v[static_cast<std::size_t>(b * (kSeq + 1) + t)]);
      ys.push_back(v[static_cast<std::size_t>(b * (kSeq + 1) + t + 1)]);
    }
  x = Tensor::from_vector(xs, {end - begin, kSeq});
  y = Tensor::from_vector(ys, {(end - begin) * kSeq});
}

std::vector<std::vector<float>> gradients(const nn::Model& m) {
  std::vector<std::vector<float>> out;
  for (const nn::Parameter* p : m.parameters())
    out.push_back(p->grad.to_vector<float>());
  return out;
}

double max_difference(const std::vector<std::vector<float>>& a,
                      const std::vector<std::vector<float>>& b) {
  double worst = a.size() == b.size() ? 0.0 : 1e30;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    for (std::size_t j = 0; j < a[i].size() && j < b[i].size(); ++j)
      worst = std::max(worst, static_cast<double>(std::abs(a[i][j] - b[i][j])));
  return worst;
}

TEST(GptReducer, AveragedGradientsOfTheTiedModelMatchOneProcess) {
  comm::Communicator& comm = world();
  const int rank = comm.rank(), n = comm.size();
  ops::Context ctx(Device::cpu(), 1);
  Tensor all = batch_tokens(1);

  // One process, the whole batch, mean over all positions.
  nn::Model single = nn::Model::build(kSpec, {kSeq}, kVocab, 5);
  {
    Tensor x, y;
    window(all, 0, kBatch, x, y);
    nn::SoftmaxCrossEntropy loss;
    single.zero_grad(ctx);
    loss.forward(ctx, single.forward(ctx, x), y);
    single.backward(ctx, loss.backward(ctx, 1.0f / static_cast<float>(y.numel())));
  }

  // N ranks (a seed per rank: the broadcast makes them identical), small buckets so that the
  // table and the parameters next to it share buckets with others.
  nn::Model model = nn::Model::build(kSpec, {kSeq}, kVocab, 5 + static_cast<std::uint64_t>(rank));
  parallel::broadcast_state(comm, model.parameters(), model.buffers());
  parallel::Reducer reducer(ctx, comm, model.parameters(), parallel::ReducerOptions{4096, 1024});
  model.set_grad_ready_hook([&](nn::Parameter& p) { reducer.on_grad_ready(p); });
  const std::int64_t local = kBatch / n;
  Tensor x, y;
  window(all, rank * local, (rank + 1) * local, x, y);
  nn::SoftmaxCrossEntropy loss;
  reducer.zero_grad();
  reducer.prepare_for_backward(true);
  loss.forward(ctx, model.forward(ctx, x), y);
  model.backward(ctx, loss.backward(ctx, 1.0f / static_cast<float>(y.numel())));
  reducer.finish();

  EXPECT_GT(reducer.num_buckets(), 2u);
  EXPECT_LE(max_difference(gradients(single), gradients(model)), 2e-6)
      << "rank " << rank << " of " << n;
}

// The same with the training loss DDP runs, fused into the LM head in chunks of 5 rows: the head
// adds its part of the table's gradient during forward_loss, into the bucket's view, and the
// table is still reported once, after the embedding's part (a bucket sent without it would
// miss O(1e-3)).
TEST(GptReducer, TheFusedLossInChunksGivesTheSameAveragedGradients) {
  comm::Communicator& comm = world();
  const int rank = comm.rank(), n = comm.size();
  ops::Context ctx(Device::cpu(), 1);
  Tensor all = batch_tokens(1);
  nn::Model single = nn::Model::build(kSpec, {kSeq}, kVocab, 5);
  {
    Tensor x, y;
    window(all, 0, kBatch, x, y);
    nn::SoftmaxCrossEntropy loss;
    single.zero_grad(ctx);
    loss.forward(ctx, single.forward(ctx, x), y);
    single.backward(ctx, loss.backward(ctx, 1.0f / static_cast<float>(y.numel())));
  }
  nn::Model model = nn::Model::build(kSpec, {kSeq}, kVocab, 5 + static_cast<std::uint64_t>(rank));
  parallel::broadcast_state(comm, model.parameters(), model.buffers());
  parallel::Reducer reducer(ctx, comm, model.parameters(), parallel::ReducerOptions{4096, 1024});
  model.set_grad_ready_hook([&](nn::Parameter& p) { reducer.on_grad_ready(p); });
  const std::int64_t local = kBatch / n;
  Tensor x, y;
  window(all, rank * local, (rank + 1) * local, x, y);
  nn::SoftmaxCrossEntropy loss(0.0f, nn::SoftmaxCrossEntropy::Logits::Fused, /*chunk_rows=*/5);
  reducer.zero_grad();
  reducer.prepare_for_backward(true);
  model.forward_loss(ctx, x, y, loss, 1.0f / static_cast<float>(y.numel()));
  model.backward_loss(ctx);
  reducer.finish();

  std::vector<std::vector<float>> got;
  for (const nn::Parameter* p : model.parameters())
    got.push_back(nn::unpadded(*p, p->grad).to_vector<float>());  // the table's 23 of 128 rows
  std::vector<std::vector<float>> want = gradients(single);
  want[0].resize(static_cast<std::size_t>(kVocab * 16));
  EXPECT_LE(max_difference(want, got), 2e-6) << "rank " << rank << " of " << n;
}

}  // namespace
}  // namespace lockstep::test
