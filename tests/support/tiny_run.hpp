// An in-process training run on a tiny synthetic shard set: f32 samples of 4 features, 3 classes,
// label = argmax of a fixed linear map (learnable), written with the real shard writer. The run
// itself uses a single-rank communicator, so the trainer's setup, state and loop are tested
// without MPI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lockstep/comm/local.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/data/importers.hpp"
#include "lockstep/train/config.hpp"
#include "lockstep/train/setup.hpp"
#include "support/temp_dir.hpp"

namespace lockstep::test {

struct TinySet {
  std::int64_t samples = 64;
  std::int64_t features = 4;
  int classes = 3;
  std::uint64_t seed = 21;          // of the labelling map: equal for a training and a test set
  std::uint64_t sample_stream = 2;  // of the samples: differ between the two
};

// Writes DIR/NAME-0000S-of-00002.h5; returns DIR/NAME (the data.train form).
inline std::string write_tiny_set(const std::string& dir, const std::string& name,
                                  const TinySet& spec = {}) {
  data::LabeledArray a;
  a.x = Tensor::empty({spec.samples, spec.features});
  Philox(spec.seed, spec.sample_stream).fill_uniform(a.x.data<float>(), a.x.numel(), -1.0f, 1.0f);
  Philox map(spec.seed, 1);
  for (std::int64_t i = 0; i < spec.samples; ++i) {
    int best_class = 0;
    float best = -1e30f;
    for (int c = 0; c < spec.classes; ++c) {
      float s = 0;
      for (std::int64_t f = 0; f < spec.features; ++f)
        s += a.x.data<float>()[i * spec.features + f] *
             (map.uniform(static_cast<std::uint64_t>(c * spec.features + f)) - 0.5f);
      if (s > best) best = s, best_class = c;
    }
    a.y.push_back(best_class);
  }
  a.num_classes = spec.classes;
  data::write_shard_set(a, dir, name, 2, {}, {});
  return dir + "/" + name;
}

// The tiny set of write_tiny_set(dir, "clean") written again as DIR/NAME with feature `feature`
// of global sample `index` set to `value` (NaN, Inf) for each entry of `spoiled`; returns DIR/NAME.
struct SpoiledValue {
  std::int64_t index = 0, feature = 0;
  float value = 0.0f;
};
inline std::string write_spoiled_tiny_set(const std::string& dir, const std::string& name,
                                          const std::vector<SpoiledValue>& spoiled) {
  write_tiny_set(dir, "clean");
  auto clean = data::ShardedDataset::open(dir + "/clean");
  data::LabeledArray a;
  std::vector<std::int64_t> all(static_cast<std::size_t>(clean->size()));
  for (std::size_t i = 0; i < all.size(); ++i)
    all[i] = static_cast<std::int64_t>(i);
  Tensor y;
  clean->gather(all, a.x, y);
  a.y = y.to_vector<std::int32_t>();
  a.num_classes = clean->num_classes();
  const std::int64_t features = a.x.dim(1);
  for (const SpoiledValue& v : spoiled)
    a.x.data<float>()[v.index * features + v.feature] = v.value;
  data::write_shard_set(a, dir, name, 2, {}, {});
  return dir + "/" + name;
}

// A config for it: 64 samples / global batch 8 = 8 steps per epoch, one thread, quiet.
inline train::Config tiny_config(const std::string& train, const std::string& test = "") {
  train::Config c;
  c.data_train = train;
  c.data_test = test;
  c.model_spec = "mlp:8";
  c.train_epochs = 2;
  c.train_global_batch = 8;
  c.train_seed = 3;
  c.train_threads = 1;
  c.train_eval = !test.empty();
  c.train_device = "cpu";
  c.optim_lr = 0.1;
  c.optim_momentum = 0.9;
  c.log_progress = "none";
  c.log_every = 4;
  c.data_prefetch = 2;
  return c;
}

// The text of the Error setup_run throws for `c` (in-process, one rank), or "" and a test
// failure when it succeeds.
inline std::string setup_error(const train::Config& c, train::SetupOptions options = {}) {
  try {
    auto comm = comm::make_single_rank_communicator();
    auto run = train::setup_run(c, *comm, options);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "setup_run succeeded";
  return "";
}

}  // namespace lockstep::test
