// An out-of-tree program on lockstep's library, not its trainer: a model of its own, composed in
// C++ from lockstep's layers and a layer written here (GatedLinearUnit, gated_linear_unit.hpp;
// the network is in custom_network.hpp), a synthetic image set written as a lockstep shard, and a
// hand-written loop over the data loader, the DDP engine and SGD. Run it under MPI:
//   mpirun -np 2 ./custom_model [DATA_DIR]      (DATA_DIR default: ./custom_model_data)
// It prints each epoch's mean loss (averaged over the ranks) and, per rank, a checksum of the
// trained parameters: DDP keeps the replicas identical, so every rank prints the same one.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "custom_network.hpp"
#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/comm/mpi_communicator.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/data/loader.hpp"
#include "lockstep/data/shard.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/optim/sgd.hpp"
#include "lockstep/parallel/ddp.hpp"

namespace {

using namespace lockstep;

constexpr std::int64_t kClasses = 4, kSide = 8, kSamples = 512;

// The task: an 8x8 single-channel image of Gaussian noise in which the quadrant named by the
// label is brighter. Chance is a loss of ln 4 = 1.386; a small conv net gets well below it.
void write_shard(const std::string& dir) {
  std::filesystem::create_directories(dir);
  data::ShardMeta meta;
  meta.num_classes = kClasses;
  meta.sample_shape = {1, kSide, kSide};
  meta.dtype = DType::F32;
  data::ShardWriter writer(dir + "/" + data::shard_file_name("train", 0, 1), meta);
  std::mt19937 rng(42);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> x(kSide * kSide);
  for (std::int64_t i = 0; i < kSamples; ++i) {
    const std::int32_t label = static_cast<std::int32_t>(i % kClasses);
    for (std::int64_t r = 0; r < kSide; ++r)
      for (std::int64_t c = 0; c < kSide; ++c) {
        const int quadrant = static_cast<int>((r >= kSide / 2) * 2 + (c >= kSide / 2));
        x[r * kSide + c] = noise(rng) + (quadrant == label ? 0.5f : 0.0f);
      }
    writer.append(x.data(), &label, 1);
  }
  writer.close();
}

double parameter_checksum(const nn::Model& model) {
  double sum = 0;
  for (const nn::Parameter* p : model.parameters()) {
    const float* v = p->value.data<float>();
    for (std::int64_t i = 0; i < p->value.numel(); ++i)
      sum += std::fabs(v[i]);
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  return comm::run_or_abort([&] {
    auto world = comm::make_mpi_communicator(session);
    const int rank = world->rank(), ranks = world->size();
    const std::string dir = argc > 1 ? argv[1] : "custom_model_data";
    if (rank == 0) write_shard(dir);
    world->barrier();  // the shard exists (closed, renamed) before any rank opens it

    auto dataset = data::ShardedDataset::open(dir + "/train");
    const std::int64_t global_batch = 32, local_batch = global_batch / ranks;
    data::Loader loader(dataset,
                        data::DistributedSampler(dataset->size(), ranks, rank, /*shuffle=*/true,
                                                 /*seed=*/7),
                        local_batch, {.drop_last_batch = true});

    ops::Context ctx(Device::cpu(), 1);
    // A different seed per rank on purpose: the engine broadcasts rank 0's parameters.
    nn::Model model(custom_model::custom_network(kSide, /*width=*/8, /*hidden=*/32, kClasses),
                    dataset->sample_shape(), kClasses,
                    /*seed=*/1 + static_cast<std::uint64_t>(rank));
    parallel::DdpEngine engine(ctx, model, *world, parallel::DdpOptions{});
    optim::Sgd sgd(engine.flat_params(), {.lr = 0.05f, .momentum = 0.9f});
    if (rank == 0) {
      std::string modules;
      for (std::size_t k = 0; k < model.num_layers(); ++k)
        modules += (k ? " - " : "") + model.layer(k).describe();
      std::printf("custom_model: %d ranks, %lld samples, model %s, %lld parameters\n", ranks,
                  static_cast<long long>(dataset->size()), modules.c_str(),
                  static_cast<long long>(model.num_parameters()));
    }

    for (std::int64_t epoch = 0; epoch < 4; ++epoch) {
      loader.start_epoch(epoch);
      std::vector<double> sum_and_count{0.0, 0.0};
      while (auto batch = loader.next()) {
        engine.begin_step();
        // The loss comes back unread (on a GPU it stays there); this example reads it each step.
        const Tensor loss_tensor = engine.forward_backward(
            batch->x, batch->y, 1.0f / static_cast<float>(batch->y.numel()), true);
        const float loss = loss_tensor.item();
        engine.finish_gradients();
        sgd.step(ctx);
        sum_and_count[0] += loss;
        sum_and_count[1] += 1;
      }
      world->allreduce(sum_and_count, comm::ReduceOp::Sum);
      if (rank == 0)
        std::printf("epoch %lld mean loss %.4f\n", static_cast<long long>(epoch + 1),
                    sum_and_count[0] / sum_and_count[1]);
    }
    std::fflush(stdout);
    world->barrier();
    std::printf("rank %d parameter checksum %.6f\n", rank, parameter_checksum(model));
    return 0;
  });
}
